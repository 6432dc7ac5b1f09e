"""Synthetic workload: rows like ingero trace writes, noise, slowdown, control file, /proc tree."""

from __future__ import annotations

import sqlite3
import statistics
from pathlib import Path

import pytest

from ingero.collectors.nodedb import read_window
from ingero.collectors.procfs import ProcReader
from ingero.workload.generator import WorkloadGenerator, WorkloadProfile
from ingero.workload.runner import SyntheticProc, WorkloadRunner, read_control

T0 = 1_700_000_000.0


def rates(slowdown: float, seed: int = 3, n: int = 200) -> list[float]:
    gen = WorkloadGenerator(WorkloadProfile(launch_rate=2000.0, noise=0.03), seed=seed)
    out = []
    for i in range(n):
        rows = gen.tick(T0 + i, T0 + i + 1, slowdown)
        (launch,) = [r for r in rows.intervals if r["op"] == "cudaLaunchKernel"]
        out.append(float(launch["count"]))
    return out


def test_launch_rate_mean_and_noise() -> None:
    values = rates(0.0)
    assert statistics.mean(values) == pytest.approx(2000.0, rel=0.01)
    assert statistics.stdev(values) / statistics.mean(values) == pytest.approx(0.03, rel=0.25)


def test_slowdown_reduces_rate_and_gpu_busy() -> None:
    assert statistics.mean(rates(0.3)) == pytest.approx(1400.0, rel=0.01)
    gen = WorkloadGenerator(WorkloadProfile(noise=0.0), seed=1)
    fast = gen.tick(T0, T0 + 1, 0.0)
    slow = gen.tick(T0 + 1, T0 + 2, 0.3)
    assert slow.gpu_intervals[0]["busy_ns"] == pytest.approx(0.7 * fast.gpu_intervals[0]["busy_ns"])
    assert slow.cpu_busy > fast.cpu_busy


def test_same_seed_same_rows() -> None:
    assert rates(0.0, seed=7, n=10) == rates(0.0, seed=7, n=10)
    assert rates(0.0, seed=7, n=10) != rates(0.0, seed=8, n=10)


def test_steps_carry_fractions_across_ticks() -> None:
    gen = WorkloadGenerator(WorkloadProfile(launch_rate=150.0, launches_per_step=100, noise=0.0))
    steps = 0
    for i in range(10):
        rows = gen.tick(T0 + i, T0 + i + 1)
        steps += sum(r["count"] for r in rows.intervals if r["op"] == "step")
    assert steps == 15  # 1.5 steps per second, none lost to rounding


def test_rows_fit_the_node_db_schema(tmp_path: Path) -> None:
    runner = WorkloadRunner(
        tmp_path / "n.db", WorkloadProfile(job_id="j1", rank=2), interval_s=0.02, seed=1
    )
    ticks = runner.run(duration_s=0.3)
    assert ticks >= 3

    conn = sqlite3.connect(tmp_path / "n.db")
    ops = {row[0] for row in conn.execute("SELECT DISTINCT op FROM intervals")}
    assert ops == {"cudaLaunchKernel", "cudaStreamSynchronize", "step"}
    assert conn.execute("SELECT DISTINCT job_id, rank FROM intervals").fetchall() == [("j1", 2)]
    assert conn.execute("SELECT COUNT(DISTINCT gpu) FROM gpu_intervals").fetchone()[0] == 2
    assert conn.execute("SELECT COUNT(*) FROM host_intervals").fetchone()[0] == ticks
    conn.close()


@pytest.mark.parametrize(
    ("content", "expected"),
    [("0.3\n", 0.3), ("0", 0.0), ("", 0.0), ("fast", None), ("1.5", None), ("-0.1", None)],
)
def test_control_file_values(tmp_path: Path, content: str, expected: float | None) -> None:
    path = tmp_path / "control"
    path.write_text(content)
    assert read_control(path) == expected


def test_missing_control_file_is_none(tmp_path: Path) -> None:
    assert read_control(tmp_path / "absent") is None


def test_control_file_overrides_and_bad_values_fall_back(tmp_path: Path) -> None:
    control = tmp_path / "control"
    runner = WorkloadRunner(tmp_path / "n.db", WorkloadProfile(), slowdown=0.4, control=control)
    assert runner.current_slowdown() == 0.0
    runner.toggle()  # what SIGUSR1 does
    assert runner.current_slowdown() == 0.4
    control.write_text("0.2")
    assert runner.current_slowdown() == 0.2
    control.write_text("garbage")
    assert runner.current_slowdown() == 0.4


def test_synthetic_proc_reads_back_through_the_real_reader(tmp_path: Path) -> None:
    proc = SyntheticProc(tmp_path / "proc")
    proc.write(1.0, 0.3, 0.6)
    reader = ProcReader(tmp_path / "proc")
    assert reader.cpu_busy_fraction() is None
    proc.write(1.0, 0.45, 0.6)
    assert reader.cpu_busy_fraction() == pytest.approx(0.45, abs=0.01)
    assert reader.meminfo().available_fraction == pytest.approx(0.6, abs=0.001)


def test_window_over_generated_rows(tmp_path: Path) -> None:
    from ingero.nodedb.schema import connect

    db = connect(tmp_path / "n.db")
    gen = WorkloadGenerator(WorkloadProfile(noise=0.0), seed=1)
    for i in range(20):
        rows = gen.tick(T0 + i * 0.25, T0 + (i + 1) * 0.25, 0.3 if i >= 16 else 0.0)
        db.table("intervals").insert_all(rows.intervals)
        db.table("gpu_intervals").insert_all(rows.gpu_intervals)
    db.conn.commit()
    slowed = read_window(tmp_path / "n.db", T0 + 5.0, 1.0)
    assert slowed.kernel_launch_rate == pytest.approx(1400.0, rel=0.01)
    assert slowed.gpu_busy_fraction == pytest.approx(0.85 * 0.7, rel=0.01)
    earlier = read_window(tmp_path / "n.db", T0 + 4.0, 1.0)
    assert earlier.kernel_launch_rate == pytest.approx(2000.0, rel=0.01)


@pytest.mark.parametrize(
    "profile",
    [
        WorkloadProfile(launch_rate=0),
        WorkloadProfile(launch_rate=float("nan")),
        WorkloadProfile(gpus=0),
        WorkloadProfile(gpu_busy=1.5),
        WorkloadProfile(noise=0.9),
    ],
)
def test_bad_profiles_are_rejected(profile: WorkloadProfile) -> None:
    with pytest.raises(ValueError):
        WorkloadGenerator(profile)


@pytest.mark.parametrize(
    ("start", "end", "slowdown"), [(1.0, 1.0, 0.0), (1.0, 2.0, 1.0), (1.0, 2.0, -0.1)]
)
def test_bad_ticks_are_rejected(start: float, end: float, slowdown: float) -> None:
    with pytest.raises(ValueError):
        WorkloadGenerator(WorkloadProfile()).tick(start, end, slowdown)
