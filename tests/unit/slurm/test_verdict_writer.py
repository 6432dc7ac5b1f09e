"""The verdict writer (Fleet's side) against a backend double: when a job is written, what
it is written with, and what is never written; and sacct's output as the scontrol backend
reads it (lines as Slurm 22.05 and 25.11 print them)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import pytest

from ingero.runtime.clock import ManualClock
from ingero.schema.events import Event
from ingero.slurm.backend import JobRecord, SlurmError
from ingero.slurm.scontrol_backend import ScontrolBackend, parse_sacct
from ingero.slurm.verdict import VerdictConfig, decode_part, split_admin_comment
from ingero.slurm.verdict_writer import (
    GIVEN_UP,
    NOT_THIS_CLUSTER,
    PARTIAL,
    REFUSED,
    UNCHANGED,
    WRITTEN,
    VerdictWriter,
)

CONFIG = VerdictConfig(enabled=True, retry=10.0, give_up=100.0)


@dataclass
class Group:
    cluster_id: str
    job_id: str | None


@dataclass
class Tick:
    groups: tuple[Group, ...]


class Accounting:
    """A backend's accounting half, in memory."""

    name = "double"

    def __init__(self, lowercased: bool = False) -> None:
        self.records: dict[str, JobRecord] = {}
        self.writes: list[tuple[str, str]] = []
        self.lowercased = lowercased
        self.fail = 0

    @property
    def admin_comment_lowercased(self) -> bool:
        return self.lowercased

    def cluster_name(self) -> str:
        return "c"

    def job_record(self, job_id: str) -> JobRecord | None:
        if self.fail:
            self.fail -= 1
            raise SlurmError("sacct -X -n: exit 1: slurmdbd down")
        return self.records.get(job_id)

    def set_admin_comment(self, job_id: str, text: str) -> None:
        self.writes.append((job_id, text))
        stored = text.lower() if self.lowercased else text
        self.records[job_id] = dataclasses.replace(self.records[job_id], admin_comment=stored)

    def __getattr__(self, name: str) -> Any:  # the node half is not used
        raise AttributeError(name)


def straggler(ts: float, job: str = "7", **kw: Any) -> Event:
    return Event(
        type="straggler_state",
        node_id="n3",
        cluster_id=kw.pop("cluster", "c"),
        timestamp=ts,
        job_id=job,
        rank=2,
        score=0.3,
        event_id="00000000-0000-0000-0000-000000000001",
        extra={"cause_class": "node"},
    )


def writer(backend: Accounting, clock: ManualClock) -> VerdictWriter:
    return VerdictWriter(CONFIG, backend, clock)  # type: ignore[arg-type]


def ended(start: float, comment: str | None = None) -> JobRecord:
    return JobRecord("7", "COMPLETED", start, start + 600, 4, comment)


def run_due(w: VerdictWriter) -> list[str | None]:
    """What the worker thread does once: every job whose check is due, checked."""
    mono = w._clock.monotonic()
    due = [(k, f) for k, f in list(w._jobs.items()) if f.left is not None and f.next_check <= mono]
    return [w.check(k, f) for k, f in due]


def test_a_job_is_written_once_its_group_is_gone_and_its_record_ended() -> None:
    clock, slurm = ManualClock(), Accounting()
    w = writer(slurm, clock)
    t0 = clock.now()
    w.on_tick(Tick((Group("c", "7"), Group("c", None))))
    w.on_events([straggler(t0 + 10)])
    clock.advance(60)
    w.on_tick(Tick(()))  # the job's nodes push with no job now
    assert run_due(w) == []  # not at once: the job's last events come after this tick
    clock.advance(10)
    assert run_due(w) == [None]  # no record yet: retried
    slurm.records["7"] = JobRecord("7", "RUNNING", t0 + 1)
    clock.advance(10)
    assert run_due(w) == [None]
    slurm.records["7"] = ended(t0 + 1, "site: ticket 42")
    clock.advance(10)
    assert run_due(w) == [WRITTEN]
    [(job, text)] = slurm.writes
    site, part = split_admin_comment(text)
    assert job == "7" and site == "site: ticket 42"
    assert decode_part(part or "")["stragglers"][0]["node"] == "n3"
    assert w.outcomes[WRITTEN] == 1 and w.pending() == 0
    # a late event of the finished job starts no second verdict
    w.on_events([straggler(t0 + 700)])
    w.on_tick(Tick(()))
    clock.advance(20)
    assert run_due(w) == [] and len(slurm.writes) == 1


def test_a_job_that_began_before_fleet_is_left_to_the_backfill() -> None:
    clock, slurm = ManualClock(1_700_000_000.6), Accounting()
    w = writer(slurm, clock)
    slurm.records["7"] = ended(1_700_000_000 - 1)
    # Slurm's whole seconds: a job of Fleet's own first second is no missed one
    slurm.records["8"] = dataclasses.replace(ended(1_700_000_000), job_id="8")
    w.on_tick(Tick((Group("c", "7"), Group("c", "8"))))
    w.on_tick(Tick(()))
    clock.advance(10)
    assert sorted(map(str, run_due(w))) == [PARTIAL, WRITTEN]
    assert [job for job, _ in slurm.writes] == ["8"]


def test_jobs_of_another_cluster_and_jobs_never_ended_are_let_go() -> None:
    clock, slurm = ManualClock(), Accounting()
    w = writer(slurm, clock)
    w.on_tick(Tick((Group("other", "7"), Group("c", "8"))))
    w.on_tick(Tick(()))
    slurm.records["8"] = JobRecord("8", "RUNNING", clock.now() + 1)
    clock.advance(10)
    assert sorted(map(str, run_due(w))) == sorted([NOT_THIS_CLUSTER, "None"])
    clock.advance(100)
    assert run_due(w) == [GIVEN_UP]
    assert slurm.writes == [] and w.pending() == 0


def test_a_job_that_comes_back_is_followed_again() -> None:
    clock, slurm = ManualClock(), Accounting()
    w = writer(slurm, clock)
    w.on_tick(Tick((Group("c", "7"),)))
    w.on_tick(Tick(()))
    w.on_tick(Tick((Group("c", "7"),)))  # its nodes name it again before any check
    clock.advance(10)
    assert run_due(w) == [] and w.pending() == 0


def test_an_unchanged_verdict_is_not_written_again() -> None:
    slurm = Accounting()
    t0 = ManualClock().now()
    slurm.records["7"] = ended(t0 + 1)
    outcomes = []
    # the same job and events twice (a second Fleet, a backfill): the text is the same
    for _ in range(2):
        clock = ManualClock(t0)
        w = writer(slurm, clock)
        w.on_tick(Tick((Group("c", "7"),)))
        w.on_events([straggler(t0 + 10)])
        w.on_tick(Tick(()))
        clock.advance(10)
        outcomes += run_due(w)
    assert outcomes == [WRITTEN, UNCHANGED] and len(slurm.writes) == 1


def test_a_lowercasing_sacctmgr_never_destroys_a_site_text() -> None:
    clock, slurm = ManualClock(), Accounting(lowercased=True)
    w = writer(slurm, clock)
    for job, comment in (("7", "JS1:H4sIAAAA"), ("8", "site: ok")):
        w.on_tick(Tick((Group("c", job),)))
        slurm.records[job] = dataclasses.replace(ended(clock.now() + 1, comment), job_id=job)
    w.on_tick(Tick(()))
    clock.advance(10)
    assert sorted(map(str, run_due(w))) == [REFUSED, WRITTEN]
    [(job, text)] = slurm.writes
    assert job == "8" and " INGERO1B32:" in text  # the form that survives lowercasing
    assert decode_part(slurm.records["8"].admin_comment or "")["job"] == "8"
    assert slurm.records["7"].admin_comment == "JS1:H4sIAAAA"


def test_a_failed_slurm_call_is_counted_and_retried() -> None:
    clock, slurm = ManualClock(), Accounting()
    slurm.fail = 1
    w = writer(slurm, clock)
    w.on_tick(Tick((Group("c", "7"),)))
    slurm.records["7"] = ended(clock.now() + 1)
    w.on_tick(Tick(()))
    clock.advance(10)
    assert run_due(w) == [None] and w.failures == 1
    clock.advance(10)
    assert run_due(w) == [WRITTEN]


def test_jobs_beyond_max_jobs_are_not_followed() -> None:
    clock, slurm = ManualClock(), Accounting()
    w = VerdictWriter(dataclasses.replace(CONFIG, max_jobs=2), slurm, clock)  # type: ignore[arg-type]
    w.on_tick(Tick(tuple(Group("c", str(j)) for j in range(5))))
    assert len(w._jobs) == 2 and w.dropped == 3


# -- sacct as the scontrol backend reads it -------------------------------------------

SACCT = (
    # Slurm 22.05.8 and 25.11.7 (tests/integration/slurm/test_verdict.py's clusters)
    "1|COMPLETED|2026-12-06T19:43:11|2026-12-06T19:43:12|1|\n"
    "2|RUNNING|2026-12-06T20:33:40|Unknown|4|\n"
    "3|CANCELLED by 0|2026-12-06T20:33:40|2026-12-06T20:34:00|2|site | text with a bar\n"
    "4|PENDING|Unknown|Unknown|0|\n"
)


def test_sacct_lines_are_job_records() -> None:
    one, two, three, four = parse_sacct(SACCT)
    assert one.state == "COMPLETED" and one.ended and one.nodes == 1
    assert one.end is not None and one.start is not None and one.end - one.start == 1
    assert two.state == "RUNNING" and two.end is None and not two.ended
    assert three.state == "CANCELLED" and three.ended
    assert three.admin_comment == "site | text with a bar"
    assert four.start is None and not four.ended
    with pytest.raises(SlurmError, match="sacct: unexpected line"):
        parse_sacct("garbage\n")


def test_the_commands_the_scontrol_backend_runs() -> None:
    calls: list[list[str]] = []

    def runner(args: Any, timeout: float) -> str:
        calls.append(list(args))
        if args[0] == "sacctmgr" and args[1] == "--version":
            return "slurm 22.05.8\n"
        return SACCT if args[0] == "sacct" else " Modified jobs...\n"

    backend = ScontrolBackend(runner=runner)
    assert backend.admin_comment_lowercased  # 22.05's sacctmgr lowercases
    record = backend.job_record("3")
    assert record is not None and record.job_id == "3"
    backend.set_admin_comment("3", "ingero: x INGERO1:AAAA")
    assert calls[-1] == [
        "sacctmgr", "-i", "modify", "job", "where", "jobid=3", "set",
        "AdminComment=ingero: x INGERO1:AAAA",
    ]  # fmt: skip
    assert [r.job_id for r in backend.ended_jobs(0, 1)] == ["1", "3"]
    with pytest.raises(ValueError, match="invalid Slurm job id"):
        backend.job_record("3; rm")
    with pytest.raises(ValueError, match="one line without quotes"):
        backend.set_admin_comment("3", 'x" y')
    assert not ScontrolBackend(runner=lambda a, t: "slurm 25.11.7\n").admin_comment_lowercased
