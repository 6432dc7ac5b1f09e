"""Synthetic workload: rows like ingero trace writes, noise, slowdown, control file, /proc tree."""

from __future__ import annotations

import os
import sqlite3
import statistics
import time
from pathlib import Path

import pytest

from ingero.collectors.procfs import ProcReader
from ingero.nodedb.schema import connect
from ingero.nodedb.window import read_window
from ingero.otlp.health import INFERENCE_STEP_RATE
from ingero.push.engines import EngineWatcher
from ingero.push.sampler import NodeSample, NodeSampler
from ingero.push.score import ScoreConfig
from ingero.runtime.clock import ManualClock
from ingero.workload.generator import CAUSES, WorkloadGenerator, WorkloadProfile
from ingero.workload.runner import Control, SyntheticProc, WorkloadRunner, read_control

T0 = 1_700_000_000.0


def rates(slowdown: float, seed: int = 3, n: int = 200, shape: str = "gpu-bound") -> list[float]:
    gen = WorkloadGenerator(WorkloadProfile(shape=shape, noise=0.03), seed=seed)
    out = []
    for i in range(n):
        rows = gen.tick(T0 + i, T0 + i + 1, slowdown)
        (launch,) = [r for r in rows.intervals if r["op"] == "cuLaunchKernel"]
        out.append(float(launch["count"]))
    return out


@pytest.mark.parametrize(("shape", "rate"), [("gpu-bound", 3_484.0), ("cpu-bound", 19_500.0)])
def test_launch_rate_mean_and_noise_are_the_reference_s(shape: str, rate: float) -> None:
    values = rates(0.0, shape=shape)
    assert statistics.mean(values) == pytest.approx(rate, rel=0.01)
    assert statistics.stdev(values) / statistics.mean(values) == pytest.approx(0.03, rel=0.25)


@pytest.mark.parametrize(
    ("shape", "ops", "sync_per_s", "busy"),
    [
        ("cpu-bound", {"cuLaunchKernel", "cudaDeviceSynchronize", "cuMemAlloc", "offcpu"},
         16.0, 0.15),
        ("gpu-bound", {"cuLaunchKernel", "cudaDeviceSynchronize", "cudaMemcpyAsync", "offcpu"},
         1.0, 0.98),
    ],
)  # fmt: skip
def test_rows_are_what_the_real_tracer_writes_on_a_gpu(
    shape: str, ops: set[str], sync_per_s: float, busy: float
) -> None:
    gen = WorkloadGenerator(WorkloadProfile(shape=shape, noise=0.0, job_id="9", rank=1), seed=1)
    first = gen.tick(T0, T0 + 10)
    assert {r["op"] for r in first.intervals} == ops
    # Driver-API launches only, no step rows: nothing on a real node writes either.
    assert not {"cudaLaunchKernel", "step"} & {r["op"] for r in first.intervals}
    assert {r["source"] for r in first.intervals if r["op"] == "cuLaunchKernel"} == {"cuda_driver"}
    sync = next(r for r in first.intervals if r["op"] == "cudaDeviceSynchronize")
    assert sync["count"] == pytest.approx(10 * sync_per_s)
    later = gen.tick(T0 + 10, T0 + 20)
    assert "cuMemAlloc" not in {r["op"] for r in later.intervals}  # only at start
    (gpu,) = later.gpu_intervals
    assert gpu["source"] == "nvml" and gpu["busy_ns"] == pytest.approx(busy * 10e9)
    assert gpu["mem_total_bytes"] == 81_559 * 2**20 and gpu["xid_count"] == 0
    assert gpu["retired_pages"] is None  # an H100 does not retire pages: not supported
    assert later.gpu_processes == [
        {"ts_end": T0 + 20, "gpu": 0, "pid": 4242, "used_memory_bytes": gpu["mem_used_bytes"],
         "job_id": "9", "rank": 1}
    ]  # fmt: skip


def test_slowdown_reduces_every_rate_and_gpu_busy_but_not_host_cpu() -> None:
    assert statistics.mean(rates(0.3)) == pytest.approx(0.7 * 3_484.0, rel=0.01)
    fast = WorkloadGenerator(WorkloadProfile(noise=0.0), seed=1).tick(T0, T0 + 10, 0.0)
    slow = WorkloadGenerator(WorkloadProfile(noise=0.0), seed=1).tick(T0, T0 + 10, 0.3)
    assert slow.gpu_intervals[0]["busy_ns"] == pytest.approx(
        0.7 * fast.gpu_intervals[0]["busy_ns"], rel=0.02
    )
    for op in ("cudaDeviceSynchronize", "cudaMemcpyAsync"):
        count = {r["op"]: r["count"] for r in slow.intervals}[op]
        assert count == pytest.approx(
            0.7 * {r["op"]: r["count"] for r in fast.intervals}[op], abs=1
        )
    assert slow.host_intervals[0]["offcpu_ns"] > fast.host_intervals[0]["offcpu_ns"]
    assert slow.cpu_busy == fast.cpu_busy


def test_a_stalled_process_records_nothing_but_keeps_its_gpu() -> None:
    gen = WorkloadGenerator(WorkloadProfile(noise=0.0, job_id="9"), seed=1)
    gen.tick(T0, T0 + 1)
    rows = gen.tick(T0 + 1, T0 + 2, stalled=True)
    assert rows.intervals == []
    (gpu,) = rows.gpu_intervals
    assert gpu["busy_ns"] == 0 and gpu["mem_used_bytes"] == 18 * 2**30
    assert [p["pid"] for p in rows.gpu_processes] == [4242]
    assert rows.host_intervals[0]["offcpu_ns"] == 0


def test_rare_calls_carry_fractions_across_short_intervals() -> None:
    gen = WorkloadGenerator(WorkloadProfile(noise=0.0), seed=1)
    syncs = 0
    for i in range(40):
        rows = gen.tick(T0 + i * 0.25, T0 + (i + 1) * 0.25)
        syncs += sum(r["count"] for r in rows.intervals if r["op"] == "cudaDeviceSynchronize")
    assert syncs == 10  # 1/s over 10 s, none lost to rounding


def test_same_seed_same_rows() -> None:
    assert rates(0.0, seed=7, n=10) == rates(0.0, seed=7, n=10)
    assert rates(0.0, seed=7, n=10) != rates(0.0, seed=8, n=10)


def test_rows_fit_the_node_db_schema(tmp_path: Path) -> None:
    runner = WorkloadRunner(
        tmp_path / "n.db", WorkloadProfile(job_id="j1", rank=2, gpus=2), interval_s=0.02, seed=1
    )
    ticks = runner.run(duration_s=0.3)
    assert ticks >= 3

    conn = sqlite3.connect(tmp_path / "n.db")
    ops = {row[0] for row in conn.execute("SELECT DISTINCT op FROM intervals")}
    assert {"cuLaunchKernel", "cudaMemcpyAsync", "offcpu"} <= ops
    assert conn.execute("SELECT DISTINCT job_id, rank FROM intervals").fetchall() == [("j1", 2)]
    assert conn.execute("SELECT COUNT(DISTINCT gpu) FROM gpu_intervals").fetchone()[0] == 2
    assert conn.execute("SELECT COUNT(*) FROM gpu_processes").fetchone()[0] == 2 * ticks
    assert conn.execute("SELECT COUNT(*) FROM host_intervals").fetchone()[0] == ticks
    conn.close()


def test_a_late_interval_is_longer_and_not_followed_by_short_ones(tmp_path: Path) -> None:
    """As ``ingero trace``'s: held up (here by a writer holding the node DB), the runner
    writes one longer interval, then whole ones again, never a burst of short ones."""
    import threading

    interval = 0.05
    runner = WorkloadRunner(tmp_path / "n.db", WorkloadProfile(), interval_s=interval, seed=1)
    thread = threading.Thread(target=runner.run)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not host_rows(tmp_path / "n.db"):
            assert time.monotonic() < deadline, "no interval written"
            time.sleep(0.01)
        blocker = sqlite3.connect(tmp_path / "n.db", isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        time.sleep(8 * interval)  # the runner's next write waits for this transaction
        blocker.execute("COMMIT")
        blocker.close()
        written = len(host_rows(tmp_path / "n.db"))
        while len(host_rows(tmp_path / "n.db")) < written + 4:
            assert time.monotonic() < deadline, "too few intervals after the late one"
            time.sleep(0.01)
    finally:
        runner.stop_event.set()
        thread.join()
    lengths = [end - start for start, end in host_rows(tmp_path / "n.db")]
    assert max(lengths) >= 4 * interval, lengths  # one interval was held up
    # (wall-clock row times, a monotonic schedule: a tenth for the clocks' difference)
    assert min(lengths) >= 0.9 * interval, lengths


def host_rows(db: Path) -> list[tuple[float, float]]:
    """The node DB's tracer intervals so far (none before the runner created its tables)."""
    if not db.exists():
        return []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        query = "SELECT ts_start, ts_end FROM host_intervals ORDER BY ts_end"
        return conn.execute(query).fetchall()
    except sqlite3.OperationalError:  # not created yet
        return []
    finally:
        conn.close()


def test_stall_after_stops_the_work_but_not_the_gpu_rows(tmp_path: Path) -> None:
    runner = WorkloadRunner(
        tmp_path / "n.db", WorkloadProfile(job_id="123"), interval_s=0.01, seed=1, stall_after=0.0
    )
    ticks = runner.run(duration_s=0.1)
    conn = sqlite3.connect(tmp_path / "n.db")
    assert conn.execute("SELECT COUNT(*) FROM intervals").fetchone()[0] == 0
    assert conn.execute("SELECT COUNT(*), MAX(busy_ns) FROM gpu_intervals").fetchone() == (ticks, 0)
    assert conn.execute("SELECT COUNT(*) FROM gpu_processes").fetchone()[0] == ticks
    conn.close()


def test_the_job_file_is_present_while_it_runs(tmp_path: Path) -> None:
    import threading

    from ingero.slurm.jobfile import current_jobs

    jobs = tmp_path / "jobs"
    runner = WorkloadRunner(
        tmp_path / "n.db", WorkloadProfile(job_id="123", rank=4), interval_s=0.01, seed=1,
        jobs_dir=jobs, stall_after=0.0,
    )  # fmt: skip
    worker = threading.Thread(target=runner.run)
    worker.start()
    try:
        deadline = 200
        while not current_jobs(jobs) and deadline:
            threading.Event().wait(0.01)
            deadline -= 1
        (job,) = current_jobs(jobs)
        assert (job.job_id, job.rank) == ("123", 4)
    finally:
        runner.stop_event.set()
        worker.join()
    assert current_jobs(jobs) == []


def test_a_job_file_needs_a_numeric_job_id(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="job id"):
        WorkloadRunner(tmp_path / "n.db", WorkloadProfile(), jobs_dir=tmp_path)
    with pytest.raises(ValueError, match="invalid Slurm job id"):
        WorkloadRunner(tmp_path / "n.db", WorkloadProfile(job_id="demo-1"), jobs_dir=tmp_path)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("0.3\n", Control(0.3)),
        ("0", Control(0.0)),
        ("", Control(0.0)),
        ("stall\n", Control(0.0, stalled=True)),
        ("0.3 io\n", Control(0.3, cause="io")),
        ("0.25  Throttle", Control(0.25, cause="throttle")),
        ("0.3 for 2\n", Control(0.3, intervals=2)),
        ("0.3 io FOR 1", Control(0.3, cause="io", intervals=1)),
        ("stall for 3", Control(0.0, stalled=True, intervals=3)),
        ("0.3 for 0", None),
        ("0.3 for two", None),
        ("0.3 gpu", None),
        ("fast", None),
        ("1.5", None),
        ("-0.1", None),
    ],
)
def test_control_file_values(tmp_path: Path, content: str, expected: Control | None) -> None:
    path = tmp_path / "control"
    path.write_text(content)
    read = read_control(path)
    assert (read[0] if read is not None else None) == expected


def test_a_control_for_n_intervals_runs_exactly_n_however_late_it_is_cleared(
    tmp_path: Path,
) -> None:
    control = tmp_path / "control"
    runner = WorkloadRunner(tmp_path / "n.db", WorkloadProfile(), control=control)
    control.write_text("0.3 for 2")
    assert [runner.current().slowdown for _ in range(4)] == [0.3, 0.3, 0.0, 0.0]
    control.write_text("0.2 io for 1")  # a new request
    assert [runner.current() for _ in range(2)] == [
        Control(0.2, cause="io", intervals=1),
        Control(),
    ]
    stamp = control.stat().st_mtime_ns
    control.write_text("0.2 io for 1")  # the same again, written later
    os.utime(control, ns=(stamp + 10**9, stamp + 10**9))
    assert [runner.current().slowdown for _ in range(2)] == [0.2, 0.0]
    control.write_text("0.1")  # and a plain word holds as long as it is there
    assert [runner.current().slowdown for _ in range(3)] == [0.1, 0.1, 0.1]


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
    control.write_text("stall")
    assert runner.current().stalled


def test_the_runner_s_cause_goes_with_its_slowdown_unless_the_control_file_names_one(
    tmp_path: Path,
) -> None:
    control = tmp_path / "control"
    runner = WorkloadRunner(
        tmp_path / "n.db", WorkloadProfile(), slowdown=0.4, control=control, cause="net"
    )
    runner.toggle()
    assert runner.current() == Control(0.4, cause="net")
    control.write_text("0.2")
    assert runner.current() == Control(0.2, cause="net")
    control.write_text("0.2 cpu")
    assert runner.current() == Control(0.2, cause="cpu")
    with pytest.raises(ValueError, match="cause must be one of cpu, io"):
        WorkloadRunner(tmp_path / "n.db", WorkloadProfile(), cause="disk")
    with pytest.raises(ValueError, match="slow_after must be >= 0"):
        WorkloadRunner(tmp_path / "n.db", WorkloadProfile(), slow_after=-1)


def test_a_cause_without_a_slowdown_changes_nothing() -> None:
    plain = WorkloadGenerator(WorkloadProfile(), seed=1).tick(T0, T0 + 1)
    for cause in CAUSES:
        rows = WorkloadGenerator(WorkloadProfile(), seed=1).tick(T0, T0 + 1, 0.0, cause=cause)
        assert rows == plain
    with pytest.raises(ValueError, match="cause must be one of"):
        WorkloadGenerator(WorkloadProfile()).tick(T0, T0 + 1, 0.3, cause="disk")


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
        db.table("gpu_processes").insert_all(rows.gpu_processes)
    db.conn.commit()
    slowed = read_window(tmp_path / "n.db", T0 + 5.0, 1.0)
    assert slowed.kernel_launch_rate == pytest.approx(0.7 * 3_484.0, rel=0.01)
    assert slowed.gpu_busy_fraction == pytest.approx(0.98 * 0.7, abs=0.01)
    assert slowed.gpu_pids == (4242,)
    assert slowed.gpus[0].health_measured and slowed.gpus[0].throttled_rows == 0
    earlier = read_window(tmp_path / "n.db", T0 + 4.0, 1.0)
    assert earlier.kernel_launch_rate == pytest.approx(3_484.0, rel=0.01)
    assert earlier.step_rate is None and earlier.gpu_busy_fraction == pytest.approx(0.98)


@pytest.mark.parametrize(
    "profile",
    [
        WorkloadProfile(launch_rate=0),
        WorkloadProfile(launch_rate=float("nan")),
        WorkloadProfile(gpus=0),
        WorkloadProfile(gpu_busy=1.5),
        WorkloadProfile(gpu_mem_used=-1.0),
        WorkloadProfile(gpu_mem_used=81.0),
        WorkloadProfile(noise=0.9),
        WorkloadProfile(shape="tpu-bound"),
        WorkloadProfile(shape="inference", servers=0),
        WorkloadProfile(shape="inference", servers=65),
    ],
)
def test_bad_profiles_are_rejected(profile: WorkloadProfile) -> None:
    with pytest.raises(ValueError):
        WorkloadGenerator(profile)


def test_gpu_memory_used_can_be_a_big_jobs() -> None:
    # An LLM training job's caching allocator holds nearly all of an H100.
    gen = WorkloadGenerator(WorkloadProfile(shape="gpu-bound", gpu_mem_used=76.0), seed=1)
    (row,) = gen.tick(T0, T0 + 1, 0.0).gpu_intervals
    assert row["mem_total_bytes"] - row["mem_free_bytes"] == 76 * 2**30


@pytest.mark.parametrize(
    ("start", "end", "slowdown"), [(1.0, 1.0, 0.0), (1.0, 2.0, 1.0), (1.0, 2.0, -0.1)]
)
def test_bad_ticks_are_rejected(start: float, end: float, slowdown: float) -> None:
    with pytest.raises(ValueError):
        WorkloadGenerator(WorkloadProfile()).tick(start, end, slowdown)


def test_inference_servers_are_read_by_fleet_push_as_an_engine_s_decode_streams(
    tmp_path: Path,
) -> None:
    """The runner's inference servers, read back through fleet-push's own engine watcher and
    sampler: recognised as Triton servers without /metrics, each stepping its decode stream at 1 / 25 ms with
    prefill steps on it split off; a slowdown slows the first server only (the node's
    median stays), and the node's throughput follows it."""
    proc = tmp_path / "proc"
    profile = WorkloadProfile(shape="inference", servers=3, noise=0.0, pid=500)
    runner = WorkloadRunner(tmp_path / "n.db", profile, interval_s=0.01, seed=1, proc_dir=proc)
    runner.run(duration_s=0.05)
    clock = ManualClock(T0)
    engines = EngineWatcher(db_path=tmp_path / "n.db", clock=clock, proc_root=proc)
    engines.observe()
    assert {(e.engine, e.metrics_url) for e in engines.summary().values()} == {("triton", None)}
    assert set(engines.trees()) == {500, 501, 502}
    sampler = NodeSampler(
        node_id="n1", db_path=tmp_path / "n.db", config=ScoreConfig(warmup_samples=3),
        window_s=2.0, clock=clock, proc=ProcReader(proc), engines=engines,
    )  # fmt: skip
    gen = WorkloadGenerator(profile, seed=2)
    db = connect(tmp_path / "n.db")

    def tick(slowdown: float) -> NodeSample:
        rows = gen.tick(clock.now(), clock.now() + 2.0, slowdown)
        clock.advance(2.0)
        with db.conn:
            db.table("intervals").insert_all(rows.intervals)
            db.table("stream_intervals").insert_all(rows.stream_intervals)
        return sampler.sample()

    for _ in range(6):
        healthy = tick(0.0)
    slow = tick(0.5)
    assert healthy.result is not None and slow.result is not None
    assert healthy.result.rates[INFERENCE_STEP_RATE] == pytest.approx(40.0, rel=0.05)
    assert slow.result.rates[INFERENCE_STEP_RATE] == pytest.approx(40.0, rel=0.05)
    assert slow.slowest_server is not None and slow.slowest_server.server == 500
    assert slow.result.signals["throughput"] == pytest.approx(0.5, abs=0.05)


class _WriterClock:
    """Whole seconds from 1; at the ``at``-th reading of the time a writer (as ``ingero
    demo``) notes that moment plus half a second, right after the reading, and writes the
    control file: the workload took its time just before the write."""

    def __init__(self, control: Path, at: int, runner: list[WorkloadRunner]) -> None:
        self.control, self.at, self.runner = control, at, runner
        self.calls = 0
        self.noted: float | None = None

    def now(self) -> float:
        self.calls += 1
        if self.calls == self.at:
            self.noted = self.calls + 0.5
            self.control.write_text("0.3 net\n")
        if self.calls >= self.at + 3:
            self.runner[0].stop_event.set()
        return float(self.calls)

    def monotonic(self) -> float:
        return time.monotonic()


def test_a_slowed_interval_ends_after_the_writer_noted_its_write(tmp_path: Path) -> None:
    # `ingero demo` compares the rows from its injection on with as long before (explain
    # selects them by ts_end): a slowed interval that ended before the time it noted was
    # a "before" with TCP retransmits in it (test_demo's `net` cause, once under load).
    control = tmp_path / "slowdown"
    holder: list[WorkloadRunner] = []
    clock = _WriterClock(control, at=4, runner=holder)
    runner = WorkloadRunner(
        tmp_path / "n.db", WorkloadProfile(), interval_s=0.01, seed=1, control=control, clock=clock
    )
    holder.append(runner)
    runner.run()
    conn = sqlite3.connect(tmp_path / "n.db")
    rows = conn.execute("SELECT ts_end, tcp_retransmits FROM host_intervals ORDER BY ts_end")
    slowed = [end for end, retransmits in rows.fetchall() if retransmits]
    conn.close()
    assert clock.noted is not None and slowed
    assert min(slowed) > clock.noted
