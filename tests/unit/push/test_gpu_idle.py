"""GPUs held and unused: the gpu_idle detector, table-driven on node DB rows in the shape
``ingero trace`` writes them (NVML's rows through ``reading_rows``, launch rows by pid),
aggregated as fleet-push aggregates them; time is the windows' (no clock, no sleeps)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ingero.collectors.nvml import GpuProcess, GpuReading, NvmlReading
from ingero.nodedb.window import aggregate_window
from ingero.push.gpu_idle import GpuIdleDetector, HeldJob, gpu_uses, held_jobs, idle_events
from ingero.schema.events import MESSAGE_IDS, Event
from ingero.slurm.jobcgroup import job_cgroups
from ingero.slurm.jobfile import JobInfo
from ingero.trace.gpusampler import reading_rows

T0 = 1_800_000_000.0
STEP = 300.0  # one window every 5 minutes: the table stays short
IDLE_AFTER = 1800.0  # 30 minutes, the default
JOB = HeldJob("77", (0, 1), "alice", "gpu", 0, T0)
TRAINER, NOTEBOOK = 4242, 5151


@dataclass(frozen=True)
class W:
    """One window: per GPU its NVML utilization and the pids on it; the pids that launched."""

    gpus: dict[int, tuple[float | None, tuple[int, ...]]]
    launched: tuple[int, ...] = ()
    jobs: tuple[HeldJob, ...] = (JOB,)


BUSY = (0.97, (TRAINER,))
EMPTY = (0.0, ())


def window(w: W, start: float, end: float) -> dict[int, object]:
    """The window's rows as the tracer writes them, aggregated as fleet-push reads them."""
    reading = NvmlReading(
        tuple(
            GpuReading(i, utilization=u, processes=tuple(GpuProcess(p) for p in pids))
            for i, (u, pids) in w.gpus.items()
        )
    )
    rows = reading_rows(reading, start, end)
    launches = [
        {"ts_start": start, "ts_end": end, "op": "cuLaunchKernel", "count": 900, "total_ns": 0,
         "pid": pid, "source": None}
        for pid in w.launched
    ]  # fmt: skip
    agg = aggregate_window(start, end, launches, rows.intervals, rows.processes)
    return gpu_uses(agg.gpus, agg.launch_pids)  # type: ignore[return-value]


def run(windows: list[W], idle_after: float = IDLE_AFTER) -> list[tuple[object, ...]]:
    """(window index, state, gpus, reason, since - T0, idle_s, end) of every change."""
    detector = GpuIdleDetector(idle_after, 0.01)
    out: list[tuple[object, ...]] = []
    for i, w in enumerate(windows):
        start, end = T0 + i * STEP, T0 + (i + 1) * STEP
        for c in detector.observe(list(w.jobs), window(w, start, end), start, end):  # type: ignore[arg-type]
            out.append((i, c.state, c.gpus, c.reason, c.since - T0, c.idle_s, c.end))
    return out


@dataclass(frozen=True)
class Case:
    name: str
    windows: list[W]
    expect: list[tuple[object, ...]] = field(default_factory=list)


ONE_IDLE = W({0: BUSY, 1: EMPTY}, (TRAINER,))
CASES = [
    # GPU 1 held, nobody on it, from the job's start: an episode 30 min in, since the start.
    Case("no process", [ONE_IDLE] * 7, [(5, "start", (1,), "no_process", 0.0, None, None)]),
    # A notebook's process holds GPU 1 (a CUDA context), never busy, never a launch.
    Case(
        "zero busy",
        [W({0: BUSY, 1: (0.0, (NOTEBOOK,))}, (TRAINER,))] * 6,
        [(5, "start", (1,), "zero_busy", 0.0, None, None)],
    ),
    # Both GPUs worked, then the job's processes go quiet on them: a stalled rank, a
    # straggler (health-score.md), never an idle GPU, however long.
    Case(
        "a stalled rank is not idle",
        [W({0: BUSY, 1: BUSY}, (TRAINER,))] * 2
        + [W({0: (0.0, (TRAINER,)), 1: (0.0, (TRAINER,))})] * 10,
    ),
    # ... but once its process is gone from GPU 1 the job still holds it: idle from then.
    Case(
        "worked, then its process left",
        [W({0: BUSY, 1: BUSY}, (TRAINER,))] * 2 + [ONE_IDLE] * 7,
        [(7, "start", (1,), "no_process", 600.0, None, None)],
    ),
    # A process launching on GPU 0 is listed on GPU 1 too, at 0%: launches, not idle.
    Case("launching elsewhere", [W({0: BUSY, 1: (0.0, (TRAINER,))}, (TRAINER,))] * 8),
    # NVML's busy missing (a row without utilization): no evidence either way.
    Case("busy not measured", [W({0: BUSY, 1: (None, ())}, (TRAINER,))] * 8),
    # Used again: the episode ends, idle_s from since to the end of the last idle window.
    Case(
        "used again",
        [ONE_IDLE] * 7 + [W({0: BUSY, 1: BUSY}, (TRAINER,))],
        [
            (5, "start", (1,), "no_process", 0.0, None, None),
            (7, "end", (1,), "no_process", 0.0, 2400.0, "used"),
        ],
    ),
    # The job ends (its job file goes, or its cgroup empties): job_ended.
    Case(
        "job ended",
        [ONE_IDLE] * 6 + [W({0: EMPTY, 1: EMPTY}, jobs=())],
        [
            (5, "start", (1,), "no_process", 0.0, None, None),
            (6, "end", (1,), "no_process", 0.0, 2100.0, "job_ended"),
        ],
    ),
    # GPU 0 idle too, 30 min later: the episode ends and the next counts from the change,
    # so the job's GPU-hours add up (1 GPU x 45 min + 2 GPUs x its own time).
    Case(
        "another GPU idle",
        [ONE_IDLE] * 3 + [W({0: EMPTY, 1: EMPTY})] * 7,
        [
            (5, "start", (1,), "no_process", 0.0, None, None),
            (8, "end", (1,), "no_process", 0.0, 2700.0, "changed"),
            (8, "start", (0, 1), "no_process", 2700.0, None, None),
        ],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_detector(case: Case) -> None:
    assert run(case.windows) == case.expect


def test_open_episodes_and_events_carry_the_contract() -> None:
    detector = GpuIdleDetector(IDLE_AFTER, 0.01)
    changes = []
    for i in range(7):
        start, end = T0 + i * STEP, T0 + (i + 1) * STEP
        changes += detector.observe([JOB], window(ONE_IDLE, start, end), start, end)  # type: ignore[arg-type]
    (opened,) = detector.open()
    assert (opened.event_id, opened.gpus) == (changes[0].event_id, (1,))
    end = T0 + 8 * STEP
    changes += detector.observe([], {}, end - STEP, end)
    events = idle_events(changes, node_id="n1", cluster_id="c1", timestamp=end)
    assert [e.event_id for e in events] == [changes[0].event_id] * 2
    start, stop = (Event.from_dict(e.to_dict()) for e in events)  # through the JSON form
    assert (start.type, start.job_id, start.node_id, start.cluster_id) == (
        "gpu_idle",
        "77",
        "n1",
        "c1",
    )
    assert start.extra == {"state": "start", "gpus": [1], "user": "alice", "partition": "gpu",
                           "since": T0, "reason": "no_process"}  # fmt: skip
    assert stop.extra["state"] == "end" and stop.extra["idle_s"] == 2400.0
    assert stop.extra["end"] == "job_ended" and detector.open() == []
    assert start.journal_fields()["MESSAGE_ID"] == MESSAGE_IDS["gpu_idle"]
    assert start.message() == "ingero gpu_idle: node n1 job 77 start GPUs 1 of alice (no_process)"


def job(job_id: str, gpus: list[str], started: float) -> JobInfo:
    return JobInfo(job_id, "c1", "n1", 0, 1, gpus=gpus, user="u", partition="p", started_at=started)


def test_held_jobs_skip_ended_ones_and_the_newest_job_holds_a_gpu() -> None:
    jobs = [job("1", ["0", "1"], 10.0), job("2", ["1", "2"], 20.0), job("3", ["3"], 30.0),
            job("4", ["GPU-8c5e0c4a-ffff"], 40.0)]  # fmt: skip
    # job 3's cgroup is there and empty: it ended (a stale cgroup holds no GPU).
    held = held_jobs(jobs, {"1": True, "2": True, "3": False})
    assert [(h.job_id, h.gpus) for h in held] == [("2", (1, 2)), ("1", (0,))]
    # no Slurm cgroups here at all: the job files alone say
    assert [h.job_id for h in held_jobs(jobs, None)] == ["3", "2", "1"]


def test_job_cgroups_v2_v1_and_none(tmp_path: Path) -> None:
    v2 = tmp_path / "v2" / "system.slice" / "n1_slurmstepd.scope"
    for name, populated in (("job_41", 1), ("job_42", 0)):
        (v2 / name / "step_extern").mkdir(parents=True)
        (v2 / name / "cgroup.events").write_text(f"populated {populated}\nfrozen 0\n")
    (v2 / "system").mkdir()
    assert job_cgroups(tmp_path / "v2") == {"41": True, "42": False}
    v1 = tmp_path / "v1" / "freezer" / "slurm" / "uid_1000"
    for name, procs in (("job_7", "4242\n"), ("job_8", "")):
        (v1 / name / "step_batch").mkdir(parents=True)
        (v1 / name / "cgroup.procs").write_text("")
        (v1 / name / "step_batch" / "cgroup.procs").write_text(procs)
    assert job_cgroups(tmp_path / "v1") == {"7": True, "8": False}
    (tmp_path / "none" / "system.slice").mkdir(parents=True)
    assert job_cgroups(tmp_path / "none") is None
