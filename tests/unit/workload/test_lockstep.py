"""The lock-step job model: one pace for every rank, the waiting ranks in their stream sync,
NCCL rows as the tracer writes them, hangs, a collective that never completes, a phase."""

from __future__ import annotations

import math
import os
import statistics
from pathlib import Path

import pytest

from ingero.nodedb.schema import connect
from ingero.workload.jobrunner import JobControl, JobRunner, parse_job_control
from ingero.workload.lockstep import (
    BUCKET_BYTES,
    COLLECTIVE_OP,
    SYNC_OP,
    JobProfile,
    LockstepJob,
    RankRows,
)

T0 = 1_800_000_000.0


def job(**changes: object) -> LockstepJob:
    return LockstepJob(JobProfile(job_id="77", **changes), start=T0, seed=3)  # type: ignore[arg-type]


def run(j: LockstepJob, seconds: int, start: float = T0, dt: float = 1.0) -> list[list[RankRows]]:
    """Every rank's rows, interval by interval: [interval][rank]."""
    out = []
    t = start
    for _ in range(int(seconds / dt)):
        out.append([j.rows(r, t, t + dt) for r in range(j.profile.ranks)])
        t += dt
    return out


def count(rows: RankRows, op: str) -> int:
    return sum(int(r["count"]) for r in rows.intervals if r["op"] == op)


def mean_ns(rows: list[RankRows], op: str) -> float:
    total = sum(int(r["total_ns"]) for x in rows for r in x.intervals if r["op"] == op)
    return total / max(1, sum(count(x, op) for x in rows))


def busy(rows: RankRows) -> float:
    return sum(int(g["busy_ns"]) for g in rows.gpu_intervals) / 1e9


def test_every_rank_runs_at_the_pace_of_the_slowest() -> None:
    j = job()
    run(j, 10)
    healthy = run(j, 30, T0 + 10)
    j.set_slowdown(5, 0.2, "cpu")
    slowed = run(j, 40, T0 + 40)[10:]

    def rate(intervals: list[list[RankRows]], rank: int) -> float:
        return statistics.mean(count(i[rank], "cuLaunchKernel") for i in intervals)

    for rank in range(8):
        # Every rank launches at the job's pace: 0.8 of it while one rank is 20% slower.
        assert rate(slowed, rank) / rate(healthy, rank) == pytest.approx(0.8, abs=0.04)
    rates = [rate(slowed, r) for r in range(8)]
    assert max(rates) / min(rates) < 1.03
    # The others wait for it in their end-of-step stream sync; it barely waits.
    waits = [mean_ns([i[r] for i in slowed], SYNC_OP) for r in range(8)]
    assert min(w for r, w in enumerate(waits) if r != 5) > waits[5] + 200e6
    # Its GPU waits for its host; the waiting ranks' GPUs spin in NCCL, busy.
    assert statistics.mean(busy(i[5]) for i in slowed) < 0.85
    assert statistics.mean(busy(i[0]) for i in slowed) > 0.9


def test_the_slow_rank_enters_each_collective_late_under_one_shared_numbering() -> None:
    j = job()
    j.set_slowdown(5, 0.2, "cpu")
    intervals = run(j, 20)
    calls = [c for i in intervals for x in i for c in x.nccl_calls]
    assert {c["comm_hash"] for c in calls} == {j.comm_hash}
    assert {c["op"] for c in calls} == {COLLECTIVE_OP} and {c["nranks"] for c in calls} == {8}
    assert {c["bytes"] for c in calls} == {BUCKET_BYTES}
    # The call returns at enqueue, as real NCCL's does.
    assert max(c["ts_return"] - c["ts_enter"] for c in calls) < 1e-3
    by_seq: dict[int, dict[int, float]] = {}
    for c in calls:
        by_seq.setdefault(c["seq"], {})[c["comm_rank"]] = c["ts_enter"]
    full = [s for s, ranks in by_seq.items() if len(ranks) == 8]
    assert len(full) >= 100 and sorted(full)[:3] == [1, 2, 3]
    lags = []
    for seq in full:
        entries = by_seq[seq]
        median = statistics.median(entries.values())
        lags.append(entries[5] - median)
        assert max(abs(entries[r] - median) for r in range(8) if r != 5) < 0.03
    assert statistics.median(lags) > 0.1
    # One comm row a rank and interval, counting what it entered.
    for i in intervals:
        for x in i:
            (comm,) = x.nccl_comms
            assert comm["calls"] == len(x.nccl_calls)
            assert comm["entered_seq"] == comm["returned_seq"] and comm["inflight_seq"] is None


def test_a_hang_leaves_the_peers_waiting_past_it_and_the_missing_rank_behind() -> None:
    j = job()
    run(j, 20)
    j.hang(5, T0 + 20)
    after = run(j, 10, T0 + 20)
    last = after[-1]
    entered = [x.nccl_comms[0]["entered_seq"] for x in last]
    others = {e for r, e in enumerate(entered) if r != 5}
    (ahead,) = others  # the same program: every waiting rank stops at the same point
    assert ahead > entered[5]
    # Once stopped nothing is written but the intervals' host rows and GPU rows.
    for x in last:
        assert count(x, "cuLaunchKernel") == 0 and count(x, SYNC_OP) == 0
        assert x.nccl_calls == [] and x.host_intervals
    # The waiting GPUs spin in NCCL's kernel; the missing rank's drained and idles, still
    # holding its memory and listed on it.
    assert all(busy(x) > 0.9 for r, x in enumerate(last) if r != 5)
    assert busy(last[5]) == 0 and last[5].gpu_processes
    j.release(T0 + 30)
    resumed = run(j, 10, T0 + 30)
    final = [x.nccl_comms[0]["entered_seq"] for x in resumed[-1]]
    assert min(final) > ahead and len(set(final)) <= 2


def test_a_hang_on_a_lost_gpu_says_so_in_nvml_once_with_its_xid() -> None:
    j = job()
    run(j, 20)
    j.hang(5, T0 + 20)
    j.lose_gpu(5)
    after = run(j, 3, T0 + 20)
    for i, x in enumerate(r[5] for r in after):
        (row,) = x.gpu_intervals
        assert row["lost"] == 1 and row["busy_ns"] is None and row["mem_used_bytes"] is None
        assert (row["xid_count"], row["xids"]) == ((1, "[79]") if i == 0 else (0, None))
        assert x.gpu_processes == []
    # Its peers' GPUs are as in any hang: found, spinning.
    assert all(r[k].gpu_intervals[0]["lost"] == 0 for r in after for k in range(8) if k != 5)
    j.release(T0 + 23)
    assert run(j, 1, T0 + 23)[0][5].gpu_intervals[0]["lost"] == 1  # lost until a reset


def test_a_collective_that_never_completes_stops_every_rank_at_the_same_number() -> None:
    j = job()
    run(j, 20)
    j.stuck(T0 + 20)
    last = run(j, 10, T0 + 20)[-1]
    assert len({x.nccl_comms[0]["entered_seq"] for x in last}) == 1
    assert all(count(x, "cuLaunchKernel") == 0 and busy(x) > 0.9 for x in last)


def test_a_phase_change_slows_every_rank_at_once_and_alike() -> None:
    j = job()
    before = run(j, 20)
    j.phase(0.3)
    after = run(j, 30, T0 + 20)[3:]
    for rank in range(8):
        ratio = statistics.mean(count(i[rank], "cuLaunchKernel") for i in after) / (
            statistics.mean(count(i[rank], "cuLaunchKernel") for i in before[3:])
        )
        assert ratio == pytest.approx(0.7, abs=0.04)
    assert statistics.mean(busy(i[0]) for i in after) > 0.9


def test_a_gpu_slower_with_nvml_silent_shows_in_the_arrivals_only() -> None:
    j = job()
    j.set_slowdown(5, 0.1, "gpu")
    intervals = run(j, 20)[2:]
    gpu = [g for i in intervals for g in i[5].gpu_intervals]
    assert {g["throttle_reasons"] for g in gpu} <= {0, 4} and {g["sm_clock_mhz"] for g in gpu} == {
        1980
    }
    by_seq: dict[int, dict[int, float]] = {}
    for i in intervals:
        for x in i:
            for c in x.nccl_calls:
                by_seq.setdefault(c["seq"], {})[c["comm_rank"]] = c["ts_enter"]
    lags = [e[5] - statistics.median(e.values()) for e in by_seq.values() if len(e) == 8]
    assert statistics.median(lags) > 0.04


def test_a_throttled_rank_shows_nvml_s_thermal_reason_and_a_lower_clock() -> None:
    j = job()
    j.set_slowdown(5, 0.2, "throttle")
    last = run(j, 10)[-1]
    (gpu,) = last[5].gpu_intervals
    assert gpu["throttle_reasons"] & 0x20 and gpu["sm_clock_mhz"] < 1700
    assert last[0].gpu_intervals[0]["sm_clock_mhz"] == 1980


def test_rows_fit_the_node_db_schema(tmp_path: Path) -> None:
    j = job()
    rows = run(j, 3)
    db = connect(tmp_path / "node.db")
    for x in rows[-1]:
        db.table("intervals").insert_all(x.intervals)
        db.table("gpu_intervals").insert_all(x.gpu_intervals)
        db.table("nccl_calls").insert_all(x.nccl_calls)
        db.table("nccl_comms").insert_all(x.nccl_comms)
    assert db.execute("SELECT count(*) FROM nccl_comms").fetchone()[0] == 8


def test_same_seed_same_rows_and_bad_controls_are_refused() -> None:
    a, b = job(), job()
    assert run(a, 5)[-1][3].nccl_calls == run(b, 5)[-1][3].nccl_calls
    with pytest.raises(ValueError, match="rank"):
        a.set_slowdown(8, 0.1)
    with pytest.raises(ValueError, match="cause"):
        a.set_slowdown(1, 0.1, "disk")
    with pytest.raises(ValueError, match="slowdown"):
        a.phase(1.0)
    with pytest.raises(ValueError, match="shape"):
        JobProfile(shape="inference").validate()
    a.hang(2, T0 + 5)
    with pytest.raises(ValueError, match="held"):
        a.stuck(T0 + 6)
    assert math.isinf(a.steps[-1].end)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", JobControl()),
        ("0\n", JobControl()),
        ("rank 3 0.2 cpu\n", JobControl(slow={3: (0.2, "cpu")})),
        ("rank 3 0.1 gpu\nphase 0.3\n", JobControl(slow={3: (0.1, "gpu")}, phase=0.3)),
        ("rank 5 hang", JobControl(hang=5)),
        ("rank 5 hang lost", JobControl(hang=5, lost=True)),
        ("rank 5 hang gone\n", JobControl()),
        ("stuck", JobControl(stuck=True)),
        # bad lines are skipped, the others apply
        ("rank 9 0.2\nrank 2 0.2\n", JobControl(slow={2: (0.2, None)})),
        ("rank 2 1.5\nrank x 0.1\nrank 2 0.1 disk\nfly\n", JobControl()),
    ],
)
def test_the_job_control_file(text: str, expected: JobControl) -> None:
    assert parse_job_control(text, 8) == expected


def test_the_runner_writes_every_rank_s_node_db_and_applies_the_control_file(
    tmp_path: Path,
) -> None:
    control = tmp_path / "control"
    control.write_text("rank 1 hang\n")
    runner = JobRunner(
        tmp_path / "{node}" / "ingero.db",
        JobProfile(ranks=4, job_id="12", step_s=0.2),
        interval_s=0.05,
        control=control,
        seed=1,
        proc_template=tmp_path / "{node}" / "proc",
        jobs_template=tmp_path / "{node}" / "jobs",
    )
    assert runner.run(duration_s=1.0) >= 5
    entered = {}
    for rank in range(4):
        node = tmp_path / f"node-{rank + 1:02d}"
        db = connect(node / "ingero.db")
        (pid,) = {p for (p,) in db.execute("SELECT DISTINCT pid FROM nccl_comms")}
        assert pid == os.getpid()  # every rank's rows under the job's live process
        entered[rank] = db.execute("SELECT max(entered_seq) FROM nccl_comms").fetchone()[0]
        assert (node / "proc" / "stat").exists()
        assert not (node / "jobs" / "12.json").exists()  # removed at the end, as the epilog does
    assert entered[1] < min(e for r, e in entered.items() if r != 1)
    with pytest.raises(ValueError, match="rank"):
        JobRunner(tmp_path / "one.db", JobProfile(ranks=4))
