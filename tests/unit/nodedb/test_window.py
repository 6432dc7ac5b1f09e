"""Node DB window reader: rates, GPU busy and health (gpu_intervals only; the sync-time
estimate is kept apart), unreadable DBs."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from ingero.nodedb.schema import connect
from ingero.nodedb.window import NodeDbUnavailable, read_latest, read_window

T0 = 1_700_000_000.0


def interval(
    ts_start: float, ts_end: float, op: str, count: int, total_ns: int = 0
) -> dict[str, Any]:
    return {
        "ts_start": ts_start,
        "ts_end": ts_end,
        "pid": 1,
        "source": "cuda_runtime",
        "op": op,
        "count": count,
        "total_ns": total_ns,
    }


def make_db(path: Path, intervals: list[dict[str, Any]], gpus: list[dict[str, Any]] = ()) -> Path:  # type: ignore[assignment]
    db = connect(path)
    with db.conn:
        if intervals:
            db.table("intervals").insert_all(intervals)
        if gpus:
            db.table("gpu_intervals").insert_all(gpus)
    db.conn.close()
    return path


def test_rates_over_the_covered_time(tmp_path: Path) -> None:
    rows = [interval(T0 + i, T0 + i + 1, "cudaLaunchKernel", 1000) for i in range(10)]
    rows += [interval(T0 + i, T0 + i + 1, "step", 5) for i in range(10)]
    db = make_db(tmp_path / "n.db", rows)
    w = read_window(db, end=T0 + 10, window_s=4)
    assert w.kernel_launches == 4000  # rows ending at 7, 8, 9, 10
    assert w.covered_s == pytest.approx(4.0)
    assert w.kernel_launch_rate == pytest.approx(1000.0)
    assert w.step_rate == pytest.approx(5.0)


def test_window_edges_end_inclusive_start_exclusive(tmp_path: Path) -> None:
    rows = [interval(T0 + i, T0 + i + 1, "cudaLaunchKernel", 10 * (i + 1)) for i in range(5)]
    db = make_db(tmp_path / "n.db", rows)
    w = read_window(db, end=T0 + 3, window_s=2)  # ts_end in (T0+1, T0+3]: rows 1 and 2
    assert w.kernel_launches == 20 + 30


def test_rate_does_not_depend_on_where_a_flush_falls(tmp_path: Path) -> None:
    rows = [interval(T0 + i * 0.3, T0 + (i + 1) * 0.3, "cudaLaunchKernel", 300) for i in range(40)]
    db = make_db(tmp_path / "n.db", rows)
    for end in (T0 + 5.0, T0 + 5.1, T0 + 5.25, T0 + 5.4):
        assert read_window(db, end=end, window_s=1.0).kernel_launch_rate == pytest.approx(1000.0)


def test_gpu_busy_from_gpu_intervals_per_gpu(tmp_path: Path) -> None:
    gpus = [
        {"ts_start": T0 + i, "ts_end": T0 + i + 1, "gpu": g, "busy_ns": int(b * 1e9)}
        for i in range(4)
        for g, b in ((0, 0.9), (1, 0.5))
    ]
    db = make_db(
        tmp_path / "n.db",
        [interval(T0 + i, T0 + i + 1, "cudaStreamSynchronize", 1, 100) for i in range(4)],
        gpus,
    )
    w = read_window(db, end=T0 + 4, window_s=4)
    assert w.busy_source == "gpu_intervals"
    assert w.gpu_busy == pytest.approx({0: 0.9, 1: 0.5})
    assert w.gpu_busy_fraction == pytest.approx(0.7)


def test_sync_time_is_an_estimate_apart_never_gpu_busy(tmp_path: Path) -> None:
    rows = [interval(T0 + i, T0 + i + 1, "cudaLaunchKernel", 100) for i in range(4)]
    rows += [
        interval(T0 + i, T0 + i + 1, "cudaStreamSynchronize", 10, 600_000_000) for i in range(4)
    ]
    db = make_db(tmp_path / "n.db", rows)
    w = read_window(db, end=T0 + 4, window_s=4)
    # Without gpu_intervals GPU busy was not measured: missing, whatever sync time says.
    assert w.busy_source is None and w.gpu_busy_fraction is None and w.gpus == {}
    assert w.sync_busy_estimate == pytest.approx(0.6)


def test_no_busy_data_is_none(tmp_path: Path) -> None:
    db = make_db(tmp_path / "n.db", [interval(T0, T0 + 1, "cudaLaunchKernel", 100)])
    w = read_window(db, end=T0 + 1, window_s=1)
    assert w.busy_source is None and w.gpu_busy_fraction is None


def test_empty_window_is_zero_work_and_unknown_rates_not_an_error(tmp_path: Path) -> None:
    db = make_db(tmp_path / "n.db", [interval(T0, T0 + 1, "cudaLaunchKernel", 100)])
    w = read_window(db, end=T0 + 100, window_s=5)
    # Nothing recorded: no launches counted, and the rates are unknown rather than 0.
    assert w.kernel_launches == 0 and w.kernel_launch_rate is None
    assert w.covered_s == 0.0 and w.step_rate is None


def test_driver_api_launches_are_kernel_launches(tmp_path: Path) -> None:
    """What PyTorch built against CUDA 13 records on an H100: cuLaunchKernel only."""
    rows = [
        {**interval(T0 + i, T0 + i + 1, "cuLaunchKernel", 19_500), "source": "cuda_driver"}
        for i in range(5)
    ]
    rows += [interval(T0 + i, T0 + i + 1, "cudaDeviceSynchronize", 16, 320_000) for i in range(5)]
    w = read_window(make_db(tmp_path / "n.db", rows), end=T0 + 5, window_s=5)
    assert w.kernel_launch_rate == pytest.approx(19_500.0)
    assert w.step_rate is None  # no step source on a real node: unknown, not 0


@pytest.mark.parametrize(
    "op", ["cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cudaLaunchKernel"]
)
def test_every_traced_launch_entry_point_is_a_kernel_launch(tmp_path: Path, op: str) -> None:
    from ingero.trace.ops import OP_IDS

    assert op in OP_IDS  # the tracer probes it
    w = read_window(make_db(tmp_path / "n.db", [interval(T0, T0 + 1, op, 7)]), T0 + 1, 1)
    assert w.kernel_launches == 7


def test_running_but_not_launching_is_zero_launches_over_covered_time(tmp_path: Path) -> None:
    rows = [
        {**interval(T0 + i, T0 + i + 1, "offcpu", 30, 10**9), "source": "host"} for i in range(5)
    ]
    w = read_window(make_db(tmp_path / "n.db", rows), end=T0 + 5, window_s=5)
    assert w.kernel_launch_rate == 0.0


def test_missing_db(tmp_path: Path) -> None:
    with pytest.raises(NodeDbUnavailable, match="does not exist"):
        read_window(tmp_path / "absent.db", end=T0, window_s=1)


def test_corrupt_db(tmp_path: Path) -> None:
    path = tmp_path / "n.db"
    path.write_bytes(b"this is not an sqlite database at all" * 100)
    with pytest.raises(NodeDbUnavailable, match="not a database"):
        read_window(path, end=T0, window_s=1)


def test_db_without_tables(tmp_path: Path) -> None:
    path = tmp_path / "n.db"
    sqlite3.connect(path).close()
    with pytest.raises(NodeDbUnavailable, match="no such table"):
        read_window(path, end=T0, window_s=1)


def test_newer_schema(tmp_path: Path) -> None:
    path = make_db(tmp_path / "n.db", [])
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.commit()
    conn.close()
    with pytest.raises(NodeDbUnavailable, match="newer"):
        read_window(path, end=T0, window_s=1)


def test_locked_db(tmp_path: Path) -> None:
    path = make_db(tmp_path / "n.db", [interval(T0, T0 + 1, "cudaLaunchKernel", 1)])
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("PRAGMA locking_mode=EXCLUSIVE")
        holder.execute("BEGIN EXCLUSIVE")
        with pytest.raises(NodeDbUnavailable, match="locked"):
            read_window(path, end=T0 + 1, window_s=1, timeout_s=0.05)
    finally:
        holder.close()
    assert read_window(path, end=T0 + 1, window_s=1).kernel_launches == 1


def test_reader_never_writes(tmp_path: Path) -> None:
    path = make_db(tmp_path / "n.db", [interval(T0, T0 + 1, "cudaLaunchKernel", 1)])
    before = path.read_bytes()
    assert read_window(path, end=T0 + 1, window_s=1).kernel_launches == 1
    assert path.read_bytes() == before
    assert not (tmp_path / "n.db-wal").exists() or (tmp_path / "n.db-wal").stat().st_size == 0


def test_bad_window() -> None:
    with pytest.raises(ValueError):
        read_window(Path("x"), end=T0, window_s=0)


def nvml_row(ts: float, gpu: int = 0, **values: Any) -> dict[str, Any]:
    row = {"ts_start": ts - 1, "ts_end": ts, "gpu": gpu, "source": "nvml", "busy_ns": 10**9,
           "mem_free_bytes": 60 * 2**30, "mem_total_bytes": 80 * 2**30,
           "mem_used_bytes": 20 * 2**30, "sm_clock_mhz": 1980, "sm_clock_max_mhz": 1980,
           "throttle_reasons": 0, "ecc_corrected": 0, "ecc_uncorrected": 0, "xid_count": 0,
           "remapped_rows_uncorrectable": 0, "remap_pending": 0, "remap_failure": 0, "lost": 0}  # fmt: skip
    row.update(values)
    return row


def test_gpu_health_over_the_window(tmp_path: Path) -> None:
    gpus = [nvml_row(T0 + i, ecc_uncorrected=3) for i in range(1, 6)]  # 3 before and during
    gpus += [
        nvml_row(T0 + 6, throttle_reasons=0x40),  # hw thermal slowdown
        nvml_row(T0 + 7, throttle_reasons=0x4),  # sw power cap: not a hardware slowdown
        nvml_row(T0 + 8, ecc_uncorrected=5, xid_count=2, xids="[48, 63]"),
        nvml_row(T0 + 9, ecc_uncorrected=5, remap_pending=1, sm_clock_mhz=1400),
    ]
    gpus += [nvml_row(T0 + 6 + i, gpu=1, throttle_reasons=None, xid_count=None,
                      ecc_uncorrected=None, ecc_corrected=None, remapped_rows_uncorrectable=None,
                      remap_pending=None, remap_failure=None) for i in range(4)]  # fmt: skip
    db = make_db(tmp_path / "n.db", [interval(T0 + 9, T0 + 10, "cuLaunchKernel", 1)], gpus)
    with connect(db).conn as conn:
        conn.execute(
            "INSERT INTO gpu_processes (ts_end, gpu, pid, job_id) VALUES (?, 0, 4242, '7')",
            (T0 + 9,),
        )
    w = read_window(db, end=T0 + 9, window_s=4)  # rows ending 6, 7, 8, 9
    g = w.gpus[0]
    assert (g.throttle_rows, g.throttled_rows, g.throttled_fraction) == (4, 1, 0.25)
    assert g.throttle_reasons == 0x44
    assert g.xids == ((T0 + 8, 48), (T0 + 8, 63)) and g.xid_watched
    # Growth from the last value before the window (3), not from the first inside it.
    assert g.new["ecc_uncorrected"] == 2 and g.counters["ecc_uncorrected"] == 5
    assert g.new["ecc_corrected"] == 0
    assert g.remap_pending is True and g.remap_failure is False
    assert g.sm_clock_mhz == pytest.approx((1980 * 3 + 1400) / 4)
    assert g.pids == (4242,) and w.gpu_pids == (4242,)
    assert g.health_measured
    # GPU 1 reports utilization and memory only (nvidia-smi-like): no health measured.
    h = w.gpus[1]
    assert not h.health_measured and h.throttled_fraction is None and h.new == {}
    assert w.gpu_busy == {0: 1.0, 1: 1.0}
    free = sum(g.mem_free_bytes or 0 for g in w.gpus.values())
    assert free / sum(g.mem_total_bytes or 0 for g in w.gpus.values()) == pytest.approx(0.75)


def test_a_counter_that_went_down_was_reset(tmp_path: Path) -> None:
    gpus = [nvml_row(T0 + 1, ecc_uncorrected=9), nvml_row(T0 + 2, ecc_uncorrected=1)]
    w = read_window(make_db(tmp_path / "n.db", [], gpus), end=T0 + 2, window_s=1)
    assert w.gpus[0].new["ecc_uncorrected"] == 1


def test_version_1_db_is_read_without_the_health_columns(tmp_path: Path) -> None:
    import sqlite_utils

    from ingero.nodedb.schema import MIGRATIONS

    path = tmp_path / "v1.db"
    old = sqlite_utils.Database(path)
    MIGRATIONS[0](old)
    old.execute("PRAGMA user_version = 1")
    old.table("gpu_intervals").insert({"ts_start": T0, "ts_end": T0 + 1, "gpu": 0,
                                       "busy_ns": 500_000_000})  # fmt: skip
    old.conn.commit()
    old.conn.close()
    w = read_window(path, end=T0 + 1, window_s=1)
    assert w.gpu_busy == {0: 0.5}
    assert not w.gpus[0].health_measured and w.gpu_pids == ()


def test_only_the_pushed_job_s_marked_steps_count(tmp_path: Path) -> None:
    """Every writer's step rows were summed into the node's step rate: 4,200 where the
    pushed job marked 200. Another job's writer, or one outside any job, now counts for no
    job but its own; with no job named every writer's count, as before."""
    rows = [interval(T0 + i, T0 + i + 1, "cudaLaunchKernel", 1000) for i in range(4)]

    def steps(job: str | None, count: int, pid: int) -> dict[str, Any]:
        row = {**interval(T0 + 3.5, T0 + 3.9, "step", count), "source": "annotate"}
        return {**row, "pid": pid, "job_id": job}

    marked = [steps("7", 200, 9), steps("8", 3000, 10), steps(None, 1000, 11)]
    db = make_db(tmp_path / "n.db", rows + marked)
    assert read_latest(db, T0 + 100, 4, None, job_id="7").steps == 200
    assert read_latest(db, T0 + 100, 4, None, job_id="8").steps == 3000
    assert read_latest(db, T0 + 100, 4, None, job_id="99").steps == 0
    assert read_latest(db, T0 + 100, 4, None).steps == 4200


def test_marked_steps_are_steps_not_tracer_intervals(tmp_path: Path) -> None:
    """The annotate server's step rows (its own flush times) give the job's step rate over
    the tracer's intervals; they neither add an interval nor keep a silent tracer alive."""
    rows = [interval(T0 + i, T0 + i + 1, "cudaLaunchKernel", 1000) for i in range(10)]
    marked = [
        {**interval(T0 + i + 0.37, T0 + i + 1.37, "step", 3), "source": "annotate", "pid": 9}
        for i in range(12)  # the job marks on after the tracer's last interval
    ]
    db = make_db(tmp_path / "n.db", rows + marked)
    w = read_window(db, end=T0 + 10, window_s=4)
    assert w.covered_s == pytest.approx(4.0)
    assert w.tracer_intervals == 4
    assert w.steps == 12  # the rows ending at 6.37, 7.37, 8.37 and 9.37
    assert w.step_rate == pytest.approx(3.0)
    latest = read_latest(db, now=T0 + 100, window_s=4, after=None)
    assert latest.latest_end == T0 + 10
