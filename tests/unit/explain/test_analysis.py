"""explain's analysis: ranked findings from a recent window against the one before it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ingero.explain.analysis import (
    TIMES,
    GpuStats,
    HostStats,
    OpStats,
    WindowData,
    explain,
    fmt_ns,
    fmt_window,
)
from ingero.explain.reader import read_processes, read_window_data
from ingero.nodedb.schema import open_node_db
from tests.unit.explain_dbs import T0, TICK_S, op_interval, workload_db

W = 300.0


def op(name: str, count: int, p95_ns: float, *, source: str = "cuda_runtime",
       total_ns: int | None = None, errors: int = 0) -> OpStats:  # fmt: skip
    total = total_ns if total_ns is not None else int(count * p95_ns / 2)
    return OpStats(source, name, count, total, p95_ns / 2, p95_ns, p95_ns * 2, errors)


def window(
    *ops: OpStats,
    end: float = T0 + 2 * W,
    host: HostStats | None = None,
    gpus: tuple[GpuStats, ...] = (),
) -> WindowData:
    return WindowData(
        start=end - W,
        end=end,
        covered_s=W,
        pids=1,
        ops=ops,
        host=host,
        gpus=gpus,
        busy_source="gpu_intervals" if gpus else None,
    )


def host(offcpu: float = 0.05, **kw: int) -> HostStats:
    values = {
        "page_allocs": 1000,
        "block_io_count": 100,
        "block_io_p99_ns": 400_000,
        "tcp_retransmits": 0,
        "dropped_events": 0,
    } | kw
    return HostStats(covered_s=W, offcpu_ns=int(offcpu * W * 1e9), **values)


def kinds(recent: WindowData, baseline: WindowData) -> list[str]:
    return [f.kind for f in explain(recent, baseline, W).findings]


def read(path: Path, end: float, job: str | None = None) -> tuple[WindowData, WindowData]:
    db = open_node_db(path)
    try:
        return (
            read_window_data(db, path, end, W, job),
            read_window_data(db, path, end - W, W, job),
        )
    finally:
        db.conn.close()


def test_an_injected_slowdown_is_named_first_as_a_launch_rate_drop(tmp_path: Path) -> None:
    path = workload_db(tmp_path / "n.db", ticks=120, slow_from=60, slowdown=0.3)
    report = explain(*read(path, T0 + 120 * TICK_S), W)
    first = report.findings[0]
    assert first.kind in ("launch_rate", "step_rate")
    launch = next(f for f in report.findings if f.kind == "launch_rate")
    assert (
        re.search(r"kernel-launch rate down (29|30|31)%", launch.message)
        and "vs the previous 5 min" in launch.message
    )
    assert launch.recent is not None and launch.baseline is not None
    assert launch.recent / launch.baseline == pytest.approx(0.7, abs=0.03)
    # the generator models the slowdown as host contention: off-CPU time up, GPUs less busy
    assert {"offcpu", "gpu_busy"} <= {f.kind for f in report.findings}
    assert [f.severity for f in report.findings] == sorted(
        (f.severity for f in report.findings), reverse=True
    )


def test_a_steady_workload_has_nothing_standing_out(tmp_path: Path) -> None:
    path = workload_db(tmp_path / "n.db", ticks=120)
    report = explain(*read(path, T0 + 120 * TICK_S), W)
    assert report.findings == []
    assert report.summary["kernel_launch_rate"] == pytest.approx(
        3_484, rel=0.02
    )  # cuLaunchKernel only
    assert report.summary["gpu_busy_source"] == "gpu_intervals"


def test_latency_growth_is_reported_with_its_factor() -> None:
    base = window(op("cudaStreamSynchronize", 100, 1_000_000), end=T0 + W)
    recent = window(op("cudaStreamSynchronize", 100, 3_100_000))
    report = explain(recent, base, W)
    latency = next(f for f in report.findings if f.kind == "op_latency")
    assert latency.message.startswith(
        f"cudaStreamSynchronize p95 up 3.1{TIMES} vs the previous 5 min"
    )
    assert "3.1 ms, was 1 ms" in latency.message
    assert report.ops[0].p95_ratio == pytest.approx(3.1)


def test_a_growing_share_of_time_is_reported() -> None:
    base = window(op("cudaMemcpy", 100, 1000, total_ns=int(0.05 * W * 1e9)), end=T0 + W)
    recent = window(op("cudaMemcpy", 100, 1000, total_ns=int(0.40 * W * 1e9)))
    findings = explain(recent, base, W).findings
    assert "cudaMemcpy 40% of traced wall time (was 5%)" in [f.message for f in findings]
    assert "sync/memcpy waits 40% of traced wall time (was 5%)" in [f.message for f in findings]


def test_nccl_collectives_are_compared() -> None:
    base = window(op("ncclAllReduce", 50, 2_000_000, source="nccl"), end=T0 + W)
    recent = window(op("ncclAllReduce", 50, 8_000_000, source="nccl"))
    finding = explain(recent, base, W).findings[0]
    assert finding.kind == "nccl_latency"
    assert finding.message.startswith(f"NCCL ncclAllReduce p95 up 4.0{TIMES}")


def test_few_calls_are_listed_but_not_compared() -> None:
    base = window(op("cudaMalloc", 3, 1000), end=T0 + W)
    recent = window(op("cudaMalloc", 3, 100_000))
    report = explain(recent, base, W)
    assert "op_latency" not in [f.kind for f in report.findings]
    assert report.ops[0].op == "cudaMalloc" and report.ops[0].p95_ratio is None


def test_new_errors_are_reported_and_steady_ones_rank_low() -> None:
    base = window(op("cudaMalloc", 100, 1000), end=T0 + W)
    new = explain(window(op("cudaMalloc", 100, 1000, errors=12)), base, W).findings
    assert new[0].message == "cudaMalloc returned an error 12 times (was 0)"
    steady_base = window(op("cudaMalloc", 100, 1000, errors=12), end=T0 + W)
    steady = explain(window(op("cudaMalloc", 100, 1000, errors=12)), steady_base, W).findings
    assert steady[0].severity < new[0].severity


def test_no_gpu_samples_is_said_with_the_sync_estimate_marked_as_one() -> None:
    recent = window(op("cuLaunchKernel", 1000, 5000, source="cuda_driver"))
    recent = WindowData(**{**recent.__dict__, "sync_busy_estimate": 0.03})
    base = window(op("cuLaunchKernel", 1000, 5000, source="cuda_driver"), end=T0 + W)
    report = explain(recent, base, W)
    assert [f.message for f in report.findings] == [
        "no GPU samples in the window (`ingero trace` or `ingero gpu-sample` writes them):"
        " GPU busy, memory and health not measured; sync-time estimate at least 3% (an"
        " estimate, not used in the score)"
    ]
    assert report.summary["gpu_busy_fraction"] is None
    assert report.summary["gpu_busy_estimate_sync"] == 0.03
    assert report.summary["not_measured"] == "step_rate, gpu_busy, gpu_health"


def test_gpu_hardware_health_findings() -> None:
    sick = GpuStats(
        0, 0.99, 40 * 2**30, 80 * 2**30, throttled_fraction=0.5,
        throttle_reasons=("sw_power_cap", "hw_thermal_slowdown"), xids=(48,),
        ecc_uncorrected_new=2, remap_pending=True, health_measured=True,
    )  # fmt: skip
    lost = GpuStats(1, None, None, None, lost=True, health_measured=True)
    base = window(op("cudaLaunchKernel", 1000, 5000), gpus=(GpuStats(0, 0.99, 1, 2),), end=T0 + W)
    report = explain(window(op("cudaLaunchKernel", 1000, 5000), gpus=(sick, lost)), base, W)
    assert [(f.kind, f.message) for f in report.findings] == [
        ("gpu_lost", "GPU 1 is lost (NVML: GPU_IS_LOST)"),
        ("gpu_ecc", "GPU 0: 2 new uncorrected ECC errors"),
        ("gpu_xid", "GPU 0 logged XID 48"),
        ("gpu_ecc", "GPU 0: a row remapping is pending (needs a GPU reset)"),
        ("gpu_throttle",
         "GPU 0 slowed by its hardware 50% of the time (sw_power_cap, hw_thermal_slowdown)"),
    ]  # fmt: skip
    assert report.summary["not_measured"] == "step_rate"


def test_gpu_busy_drop_and_low_free_memory() -> None:
    def gpus(busy: float, free_gib: int) -> tuple[GpuStats, ...]:
        return (GpuStats(0, busy, free_gib * 2**30, 80 * 2**30),)

    base = window(op("cudaLaunchKernel", 1000, 5000), gpus=gpus(0.9, 40), end=T0 + W)
    recent = window(op("cudaLaunchKernel", 1000, 5000), gpus=gpus(0.5, 2))
    messages = [f.message for f in explain(recent, base, W).findings]
    assert "GPU busy 50% (was 90%)" in messages
    assert "GPU 0 free memory 2.0 GiB of 80 GiB (2%, was 50%)" in messages


def test_a_gpu_full_since_the_baseline_is_no_finding() -> None:
    # A big job's caching allocator (or an engine's pool) fills the GPU from its start.
    def full(busy: float) -> tuple[GpuStats, ...]:
        return (GpuStats(0, busy, 2 * 2**30, 80 * 2**30),)

    base = window(op("cudaLaunchKernel", 1000, 5000), gpus=full(0.9), end=T0 + W)
    recent = window(op("cudaLaunchKernel", 1000, 5000), gpus=full(0.9))
    assert "gpu_memory" not in [f.kind for f in explain(recent, base, W).findings]


def test_host_context_findings() -> None:
    base = window(op("x", 10, 1), host=host(), end=T0 + W)
    recent = window(
        op("x", 10, 1),
        host=host(
            offcpu=0.38,
            page_allocs=8000,
            block_io_p99_ns=4_000_000,
            tcp_retransmits=25,
            dropped_events=1234,
        ),
    )
    messages = {f.kind: f.message for f in explain(recent, base, W).findings}
    assert messages["offcpu"] == "off-CPU time of traced threads 38% of wall (was 5%)"
    assert messages["page_allocs"].startswith(f"page allocations 8.0{TIMES} vs the previous 5 min")
    assert messages["block_io"] == "block I/O p99 4 ms (was 400 µs)"
    assert messages["tcp_retransmits"] == "25 TCP retransmits (was 0)"
    assert messages["dropped"].startswith("1,234 trace samples dropped")


def test_without_a_baseline_nothing_is_compared() -> None:
    empty = WindowData(start=T0, end=T0 + W, covered_s=0.0, pids=0)
    recent = window(op("cudaStreamSynchronize", 100, 3_000_000, total_ns=int(0.6 * W * 1e9)))
    found = kinds(recent, empty)
    assert found[0] == "no_baseline" or "no_baseline" in found
    assert not {"op_latency", "launch_rate", "op_share"} & set(found)
    assert "sync_share" in found  # 60% of wall waiting is worth saying on its own


def test_an_empty_recent_window_has_no_findings() -> None:
    empty = WindowData(start=T0, end=T0 + W, covered_s=0.0, pids=0)
    report = explain(empty, window(op("x", 10, 1), end=T0), W)
    assert report.recent.empty and report.findings == [] and report.ops == []


def test_percentiles_merge_weighted_by_calls(tmp_path: Path) -> None:
    end = T0 + 10
    extra = [
        op_interval(end - 5, "cudaMemcpy", 10, 100_000),
        op_interval(end, "cudaMemcpy", 30, 200_000),
    ]
    path = workload_db(tmp_path / "n.db", ticks=0, extra_intervals=extra)
    recent, _ = read(path, end)
    memcpy = recent.op("cuda_runtime", "cudaMemcpy")
    assert memcpy is not None and memcpy.count == 40
    assert memcpy.p95_ns == pytest.approx(175_000)


def test_job_filter_reads_only_that_jobs_calls(tmp_path: Path) -> None:
    path = workload_db(tmp_path / "n.db", ticks=120, slow_from=60, job_id="slow", pid=1)
    workload_db(path, ticks=120, job_id="fast", pid=2)
    end = T0 + 120 * TICK_S
    slow = explain(*read(path, end, "slow"), W, "slow")
    fast = explain(*read(path, end, "fast"), W, "fast")
    assert "launch_rate" in [f.kind for f in slow.findings]
    assert "launch_rate" not in [f.kind for f in fast.findings]
    db = open_node_db(path)
    try:
        assert [p.pid for p in read_processes(db, "fast")] == [2]
        assert {p.job_id for p in read_processes(db, None)} == {"slow", "fast"}
    finally:
        db.conn.close()


def test_formatting() -> None:
    assert [fmt_ns(v) for v in (800, 1500, 2_500_000, 3e9)] == ["800 ns", "1.5 µs", "2.5 ms", "3 s"]
    assert [fmt_window(v) for v in (30, 300, 3600, 90)] == ["30 s", "5 min", "1 h", "90 s"]
