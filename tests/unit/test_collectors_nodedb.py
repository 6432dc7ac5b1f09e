"""Node DB window reader: rates, GPU busy (gpu_intervals, else sync time), unreadable DBs."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from ingero.collectors.nodedb import NodeDbUnavailable, read_window
from ingero.nodedb.schema import connect

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


def test_gpu_busy_falls_back_to_sync_time(tmp_path: Path) -> None:
    rows = [interval(T0 + i, T0 + i + 1, "cudaLaunchKernel", 100) for i in range(4)]
    rows += [
        interval(T0 + i, T0 + i + 1, "cudaStreamSynchronize", 10, 600_000_000) for i in range(4)
    ]
    db = make_db(tmp_path / "n.db", rows)
    w = read_window(db, end=T0 + 4, window_s=4)
    assert w.busy_source == "sync"
    assert w.gpu_busy_fraction == pytest.approx(0.6)


def test_no_busy_data_is_none(tmp_path: Path) -> None:
    db = make_db(tmp_path / "n.db", [interval(T0, T0 + 1, "cudaLaunchKernel", 100)])
    w = read_window(db, end=T0 + 1, window_s=1)
    assert w.busy_source is None and w.gpu_busy_fraction is None


def test_empty_window_is_zero_work_not_an_error(tmp_path: Path) -> None:
    db = make_db(tmp_path / "n.db", [interval(T0, T0 + 1, "cudaLaunchKernel", 100)])
    w = read_window(db, end=T0 + 100, window_s=5)
    assert w.kernel_launches == 0 and w.kernel_launch_rate == 0.0
    assert w.covered_s == 0.0 and w.step_rate is None


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
