"""Hostile writers on the annotate server's pure core: buckets that outlive the connection,
per-uid caps, timeouts, a line the server fails on; and who a writer is (its Slurm cgroup,
confirmed by the job file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ingero.annotate import server as server_module
from ingero.annotate.codec import decode_refusal
from ingero.annotate.identity import Identify, process_start, slurm_job
from ingero.annotate.server import Annotations, ServerLimits, Writer
from ingero.runtime.clock import ManualClock
from ingero.slurm.jobfile import JobInfo, write_job


def core(**limits: Any) -> tuple[Annotations, ManualClock]:
    clock = ManualClock()
    return Annotations(clock, ServerLimits(**limits)), clock


def reasons(c: Annotations, conn: int) -> list[str]:
    return [decode_refusal(line)[0] for line in c.replies(conn).splitlines()]


STEP = b'{"kind":"step"}\n'


def test_a_pid_s_bucket_outlives_its_connection() -> None:
    c, clock = core(lines_per_s=1.0, burst=3)
    for conn in range(1, 4):  # connect, write, close: three times
        assert c.open(conn, Writer(5, 0))
        c.feed(conn, STEP * 2)
        c.close(conn)
    assert c.accepted == 3 and c.refused == {"rate": 3}
    clock.advance(2.0)
    c.open(9, Writer(5, 0))
    c.feed(9, STEP * 3)
    assert c.accepted == 5  # two more tokens in two seconds


def test_a_uid_s_bucket_is_shared_by_its_pids() -> None:
    c, _ = core(uid_lines_per_s=1.0, uid_burst=4)
    for pid in range(10, 15):
        c.open(pid, Writer(pid, 1000))
        c.feed(pid, STEP * 2)
    assert c.accepted == 4
    assert c.refused == {"rate": 6}
    c.open(99, Writer(99, 1001))  # another user is not charged
    c.feed(99, STEP)
    assert reasons(c, 99) == [] and c.accepted == 5


def test_remembered_writers_are_bounded_least_recently_used_first() -> None:
    c, _ = core(max_writers=2, lines_per_s=0.1, burst=1)
    for pid in (1, 2, 1, 3):  # 2 is the least recently used when 3 comes
        c.open(pid, Writer(pid, pid))
        c.feed(pid, STEP)
        c.close(pid)
    assert c.writers == 2
    assert c.accepted == 3  # 1's second line met its empty bucket
    c.open(20, Writer(1, 1))
    c.feed(20, STEP)
    assert reasons(c, 20) == ["rate"]  # 1 was remembered
    c.open(21, Writer(2, 2))
    c.feed(21, STEP)
    assert reasons(c, 21) == []  # 2 was forgotten: a full bucket again


def test_one_uid_holds_at_most_its_share_of_the_clients() -> None:
    c, _ = core(max_clients=4, max_clients_per_uid=2)
    assert c.open(1, Writer(10, 7)) and c.open(2, Writer(11, 7))
    assert not c.open(3, Writer(12, 7))
    assert decode_refusal(c.last_refusal) == (
        "clients",
        "at most 2 clients per uid (uid 7)",
    )
    assert c.open(4, Writer(20, 8))
    c.close(1)
    assert c.open(5, Writer(12, 7)) and c.clients == 3


def test_a_half_line_and_a_silent_connection_expire() -> None:
    c, clock = core(idle_s=10.0, line_timeout_s=1.0)
    for conn in (1, 2, 3):
        c.open(conn, Writer(conn, 0))
    c.feed(1, b'{"kind":"st')
    clock.advance(0.9)
    c.feed(1, b"ep")  # still inside the line: its timer runs from the line's first byte
    c.feed(3, STEP + b'{"kind"')  # a whole line, then a new one begun
    clock.advance(0.2)
    assert c.expire() == [1]
    assert reasons(c, 1) == ["idle"]
    c.close(1)
    clock.advance(0.8)
    assert c.expire() == [3]
    c.close(3)
    clock.advance(8.0)
    assert c.expire() == []
    c.feed(2, STEP)  # a whole line keeps it alive
    clock.advance(9.9)
    assert c.expire() == []
    clock.advance(0.2)
    assert c.expire() == [2] and reasons(c, 2) == ["idle"]
    assert c.refused["idle"] == 3 and c.accepted == 2


def test_a_line_the_server_fails_on_is_answered_and_the_next_one_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = server_module.decode_line

    def flaky(line: bytes, limits: Any) -> Any:
        if b"boom" in line:
            raise RuntimeError("a bug")
        return real(line, limits)

    monkeypatch.setattr(server_module, "decode_line", flaky)
    c, _ = core()
    c.open(1, Writer(5, 0))
    c.feed(1, b'{"kind":"label","name":"boom"}\n' + STEP)
    assert reasons(c, 1) == ["internal"] and c.accepted == 1


# ---- who a writer is -----------------------------------------------------------------


V2 = "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n"
V1 = "12:freezer:/slurm/uid_1000/job_42/step_batch/task_0\n11:pids:/\n"


@pytest.mark.parametrize(
    ("cgroup", "uid", "job"),
    [
        (V2, 1000, "42"),
        ("0::/system.slice/node7_slurmstepd.scope/job_9/step_extern\n", 5, "9"),  # multi-slurmd
        (V1, 1000, "42"),
        ("4:memory:/slurm_node7/uid_1000/job_42/step_0\n", 1000, "42"),
        (V1, 1001, None),  # a v1 path of another uid's job
        ("0::/user.slice/user-1000.slice/user@1000.service/app.slice/job_42\n", 1000, None),
        (
            "0::/user.slice/user-1000.slice/user@1000.service/system.slice/slurmstepd.scope/"
            "job_42\n",
            1000,
            None,
        ),  # a user's delegated subtree can name anything
        ("0::/system.slice/slurmd.service\n", 0, None),
        ("0::/\n", 1000, None),
        (V2 + "12:freezer:/slurm/uid_1000/job_43/step_0\n", 1000, None),  # they disagree
        (V2 + V1, 1000, "42"),
        ("garbage\n::\n", 1000, None),
    ],
)
def test_the_job_of_a_cgroup(cgroup: str, uid: int, job: str | None) -> None:
    assert slurm_job(cgroup, uid) == job


def fake_proc(root: Path, pid: int, cgroup: str | None, env: dict[str, str] | None) -> None:
    base = root / str(pid)
    base.mkdir(parents=True)
    if cgroup is not None:
        (base / "cgroup").write_text(cgroup)
    if env is not None:
        (base / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()))


def test_a_writer_s_job_is_its_cgroup_s_confirmed_by_the_job_file(tmp_path: Path) -> None:
    proc, jobs = tmp_path / "proc", tmp_path / "jobs"
    write_job(jobs, JobInfo("42", "c", "n1", 1, 2, ["n0", "n1"], "alice", 1000))
    claim = {"SLURM_JOB_ID": "42", "SLURM_PROCID": "5"}
    fake_proc(proc, 1, V2, claim)  # alice in her job
    fake_proc(proc, 2, V2, {"SLURM_JOB_ID": "7", "SLURM_PROCID": "5"})  # says another job
    fake_proc(proc, 3, "0::/system.slice/slurmstepd.scope/job_42/step_0\n", claim)
    fake_proc(proc, 4, "0::/\n", claim)  # outside Slurm, claiming the job
    fake_proc(proc, 5, "0::/\n", claim)  # the same, as the server's own user
    fake_proc(proc, 6, "0::/system.slice/slurmstepd.scope/job_77/step_0\n", None)  # no file
    identify = Identify(proc, jobs, trusted=frozenset({0, 500}))
    assert identify(1, 1000) == Writer(1, 1000, "42", 5)
    assert identify(2, 1000) == Writer(2, 1000, "42", 1)  # the job file's rank
    assert identify(3, 2000) == Writer(3, 2000)  # the job file names another owner
    assert identify(4, 1000) == Writer(4, 1000)
    assert identify(5, 500) == Writer(5, 500, "42", 5)
    assert identify(6, 1000) == Writer(6, 1000, "77", None)
    assert identify(404, 1000) == Writer(404, 1000)  # gone before it could be read


@pytest.mark.parametrize(
    ("stat", "started"),
    [
        (b"42 (python3) S 1 42 42 0 -1 4194560 5 0 0 0 1 2 0 0 20 0 1 0 987654 1 2\n", 987654),
        # A command name with spaces and parentheses: fields count from its last ")".
        (b"42 (a) b (c)) R 1 42 42 0 -1 4194560 5 0 0 0 1 2 0 0 20 0 1 0 12345 1 2\n", 12345),
        (b"42 (short) S 1 42\n", None),
        (b"42 (x) S 1 42 42 0 -1 0 5 0 0 0 1 2 0 0 20 0 1 0 nope 1 2\n", None),
    ],
)
def test_a_writer_s_process_start_from_its_stat(
    tmp_path: Path, stat: bytes, started: int | None
) -> None:
    fake_proc(tmp_path, 42, "0::/\n", None)
    (tmp_path / "42" / "stat").write_bytes(stat)
    assert process_start(tmp_path / "42") == started
    assert Identify(tmp_path, tmp_path / "jobs")(42, 1000) == Writer(42, 1000, started=started)
    assert process_start(tmp_path / "404") is None
