"""Read one window of the node DB into plain values for the analysis (read-only connection).

A window holds the rows whose ``ts_end`` lies in ``(end - window, end]``, as in
``ingero.collectors.nodedb``; GPU busy fractions come from that module's ``read_window`` so
``explain`` and ``fleet-push`` measure the GPU the same way.
"""

from __future__ import annotations

import sqlite3
from dataclasses import fields
from pathlib import Path

import sqlite_utils

from ingero.collectors.nodedb import NodeDbUnavailable, read_window
from ingero.collectors.nvml import throttle_names
from ingero.errors import EXIT_DATAERR, IngeroError, UnavailableError
from ingero.explain.analysis import GpuStats, HostStats, OpStats, ProcessInfo, WindowData
from ingero.nodedb.schema import SCHEMA_VERSION, SchemaError, connect
from ingero.nodedb.schema import version as schema_version
from ingero.push.config import PushConfig

DEFAULT_DB = Path(str(next(f.default for f in fields(PushConfig) if f.name == "node_db")))
NODE_TABLES = (
    "intervals",
    "raw_events",
    "host_intervals",
    "gpu_intervals",
    "gpu_processes",
    "processes",
)


class NodeDbError(IngeroError):
    """The file is not a node DB this ingero can read."""

    exit_code = EXIT_DATAERR


def open_node_db(path: Path, timeout: float = 5.0) -> sqlite_utils.Database:
    """A read-only connection to a node DB, or a one-line error naming the path and the fix."""
    if not path.exists():
        raise UnavailableError(
            f"{path}: no node DB here; record one with `ingero trace --record`"
            " or point --db at an existing one"
        )
    if path.is_dir():
        raise NodeDbError(f"{path}: is a directory, not a node DB")
    try:
        db = connect(path, readonly=True, timeout=timeout)
    except SchemaError as exc:
        raise NodeDbError(f"{exc}: written by a newer ingero; upgrade ingero here") from None
    except sqlite3.Error as exc:
        raise NodeDbError(f"{path}: not a readable SQLite node DB ({exc})") from None
    found = schema_version(db)
    if found < 1:
        # Older versions are read as they are (a v1 DB lacks only the GPU health columns).
        db.conn.close()
        raise NodeDbError(
            f"{path}: not a node DB (schema version {found}, expected 1 to {SCHEMA_VERSION})"
        )
    return db


def latest_ts(db: sqlite_utils.Database) -> float | None:
    """The newest ``ts_end`` recorded in any interval table."""
    row = db.execute(
        "SELECT MAX(t) FROM (SELECT MAX(ts_end) AS t FROM intervals"
        " UNION ALL SELECT MAX(ts_end) FROM host_intervals"
        " UNION ALL SELECT MAX(ts_end) FROM gpu_intervals)"
    ).fetchone()
    return None if row[0] is None else float(row[0])


def read_window_data(
    db: sqlite_utils.Database, path: Path, end: float, window_s: float, job_id: str | None
) -> WindowData:
    """Everything the analysis needs about ``(end - window_s, end]``; ``job_id`` filters calls."""
    start = end - window_s
    job_sql, job_args = ("AND job_id = ?", (job_id,)) if job_id else ("", ())
    conn = db.conn
    first, last, pids = conn.execute(
        f"SELECT MIN(ts_start), MAX(ts_end), COUNT(DISTINCT pid) FROM intervals"
        f" WHERE ts_end > ? AND ts_end <= ? {job_sql}",
        (start, end, *job_args),
    ).fetchone()
    covered = max(0.0, float(last) - float(first)) if first is not None else 0.0
    # Per-interval percentiles cannot be merged exactly; a count-weighted mean is close for
    # steady intervals and keeps one slow interval visible.
    ops = tuple(
        OpStats(
            source=str(src),
            op=str(op),
            count=int(count),
            total_ns=int(total or 0),
            p50_ns=float(p50 or 0.0),
            p95_ns=float(p95 or 0.0),
            p99_ns=float(p99 or 0.0),
            errors=int(errors or 0),
        )
        for src, op, count, total, p50, p95, p99, errors in conn.execute(
            f"SELECT source, op, SUM(count), SUM(total_ns),"
            f" SUM(p50_ns * count) * 1.0 / NULLIF(SUM(count), 0),"
            f" SUM(p95_ns * count) * 1.0 / NULLIF(SUM(count), 0),"
            f" SUM(p99_ns * count) * 1.0 / NULLIF(SUM(count), 0), SUM(errors)"
            f" FROM intervals WHERE ts_end > ? AND ts_end <= ? {job_sql}"
            f" GROUP BY source, op",
            (start, end, *job_args),
        )
    )
    host_row = conn.execute(
        "SELECT COUNT(*), MIN(ts_start), MAX(ts_end), SUM(offcpu_ns), SUM(page_allocs),"
        " SUM(block_io_count), MAX(block_io_p99_ns), SUM(tcp_retransmits), SUM(dropped_events)"
        " FROM host_intervals WHERE ts_end > ? AND ts_end <= ?",
        (start, end),
    ).fetchone()
    host = None
    if host_row[0]:
        host = HostStats(
            covered_s=max(0.0, float(host_row[2]) - float(host_row[1])),
            offcpu_ns=int(host_row[3] or 0),
            page_allocs=int(host_row[4] or 0),
            block_io_count=int(host_row[5] or 0),
            block_io_p99_ns=None if host_row[6] is None else int(host_row[6]),
            tcp_retransmits=int(host_row[7] or 0),
            dropped_events=int(host_row[8] or 0),
        )
    try:
        aggregates = read_window(path, end, window_s)
    except NodeDbUnavailable as exc:
        raise NodeDbError(str(exc)) from None
    gpus = tuple(
        GpuStats(
            gpu=gpu,
            busy_fraction=g.busy,
            mem_free_bytes=g.mem_free_bytes,
            mem_total_bytes=g.mem_total_bytes,
            throttled_fraction=g.throttled_fraction,
            throttle_reasons=tuple(throttle_names(g.throttle_reasons)),
            xids=tuple(x for _, x in g.xids),
            ecc_uncorrected_new=g.new.get("ecc_uncorrected"),
            remap_pending=g.remap_pending,
            remap_failure=g.remap_failure,
            lost=g.lost,
            health_measured=g.health_measured,
        )
        for gpu, g in sorted(aggregates.gpus.items())
    )
    return WindowData(
        start=start,
        end=end,
        covered_s=covered,
        pids=int(pids or 0),
        ops=ops,
        host=host,
        gpus=gpus,
        busy_source=aggregates.busy_source,
        sync_busy_estimate=aggregates.sync_busy_estimate,
    )


def read_processes(db: sqlite_utils.Database, job_id: str | None) -> list[ProcessInfo]:
    """Traced processes (of ``job_id`` when given), most recently seen first, at most 50."""
    job_sql, job_args = ("WHERE job_id = ?", (job_id,)) if job_id else ("", ())
    rows = db.execute(
        f"SELECT pid, comm, job_id, rank, last_seen FROM processes {job_sql}"
        " ORDER BY last_seen DESC, pid LIMIT 50",
        job_args,
    ).fetchall()
    return [
        ProcessInfo(
            pid=int(pid),
            comm=None if comm is None else str(comm),
            job_id=None if job is None else str(job),
            rank=None if rank is None else int(rank),
            last_seen=None if seen is None else float(seen),
        )
        for pid, comm, job, rank, seen in rows
    ]
