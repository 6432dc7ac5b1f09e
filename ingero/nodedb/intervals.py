"""Reads of the interval tables (``intervals``, ``host_intervals``, ``gpu_intervals``) for
``ingero explain``: a window's totals per op and of the host, and its rows one interval at a
time for the causal chains. Rows come back as the tables hold them; the reader shapes them.

A window holds the rows whose ``ts_end`` lies in ``(start, end]``; ``job_id`` (where given)
keeps the rows of that Slurm job (host and GPU rows are node-wide: never filtered).
"""

from __future__ import annotations

import sqlite3
from typing import Any

import sqlite_utils

from ingero.nodedb.schema import ANNOTATE_SOURCE
from ingero.nodedb.tables import job_filter

# gpu_intervals columns of node DB schema 2 (NVML): read only where present, so a version-1
# DB still explains. ``throttle_reasons`` is NVML's clocks-event bitmask; ``xids`` is the
# JSON list of the interval's critical XID numbers.
_THROTTLE_COLUMNS = ("throttle_reasons",)
_XID_COLUMNS = ("xids",)


def latest_ts(db: sqlite_utils.Database) -> float | None:
    """The newest ``ts_end`` recorded in any interval table."""
    row = db.execute(
        "SELECT MAX(t) FROM (SELECT MAX(ts_end) AS t FROM intervals"
        " UNION ALL SELECT MAX(ts_end) FROM host_intervals"
        " UNION ALL SELECT MAX(ts_end) FROM gpu_intervals)"
    ).fetchone()
    return None if row[0] is None else float(row[0])


def coverage(
    conn: sqlite3.Connection, start: float, end: float, job_id: str | None
) -> tuple[Any, Any, Any]:
    """(first ``ts_start``, last ``ts_end``, distinct pids) of the window's tracer rows: the
    time measured is the tracer's, so the job's marked-step rows (``ingero annotate``,
    written on that server's own flush) are left out."""
    job_sql, job_args = job_filter(job_id)
    first, last, pids = conn.execute(
        f"SELECT MIN(ts_start), MAX(ts_end), COUNT(DISTINCT pid) FROM intervals"
        f" WHERE ts_end > ? AND ts_end <= ? AND source != ? {job_sql}",
        (start, end, ANNOTATE_SOURCE, *job_args),
    ).fetchone()
    return first, last, pids


def op_totals(
    conn: sqlite3.Connection, start: float, end: float, job_id: str | None
) -> sqlite3.Cursor:
    """Per (source, op): count, total ns, p50/p95/p99 ns and errors over the window.
    Per-interval percentiles cannot be merged exactly; a count-weighted mean is close for
    steady intervals and keeps one slow interval visible."""
    job_sql, job_args = job_filter(job_id)
    return conn.execute(
        f"SELECT source, op, SUM(count), SUM(total_ns),"
        f" SUM(p50_ns * count) * 1.0 / NULLIF(SUM(count), 0),"
        f" SUM(p95_ns * count) * 1.0 / NULLIF(SUM(count), 0),"
        f" SUM(p99_ns * count) * 1.0 / NULLIF(SUM(count), 0), SUM(errors)"
        f" FROM intervals WHERE ts_end > ? AND ts_end <= ? {job_sql}"
        f" GROUP BY source, op",
        (start, end, *job_args),
    )


def op_pid_totals(
    conn: sqlite3.Connection, start: float, end: float, job_id: str | None
) -> sqlite3.Cursor:
    """Per (source, op, pid): count and total ns over the window."""
    job_sql, job_args = job_filter(job_id)
    return conn.execute(
        "SELECT source, op, pid, SUM(count), SUM(total_ns) FROM intervals"
        f" WHERE ts_end > ? AND ts_end <= ? {job_sql} GROUP BY source, op, pid",
        (start, end, *job_args),
    )


def host_totals(conn: sqlite3.Connection, start: float, end: float) -> tuple[Any, ...]:
    """(rows, first ``ts_start``, last ``ts_end``, off-CPU ns, page allocations, block I/O
    count, its worst p99, TCP retransmits, dropped events) of the window's host rows."""
    row: tuple[Any, ...] = conn.execute(
        "SELECT COUNT(*), MIN(ts_start), MAX(ts_end), SUM(offcpu_ns), SUM(page_allocs),"
        " SUM(block_io_count), MAX(block_io_p99_ns), SUM(tcp_retransmits), SUM(dropped_events)"
        " FROM host_intervals WHERE ts_end > ? AND ts_end <= ?",
        (start, end),
    ).fetchone()
    return row


def op_rows(
    conn: sqlite3.Connection, start: float, end: float, job_id: str | None
) -> sqlite3.Cursor:
    """The window's ``intervals`` rows in time order: ts_start, ts_end, pid, source, op,
    count, total_ns, p95_ns, errors, bytes."""
    job_sql, job_args = job_filter(job_id)
    return conn.execute(
        "SELECT ts_start, ts_end, pid, source, op, count, total_ns, p95_ns, errors, bytes"
        f" FROM intervals WHERE ts_end > ? AND ts_end <= ? {job_sql} ORDER BY ts_end",
        (start, end, *job_args),
    )


def host_rows(conn: sqlite3.Connection, start: float, end: float) -> sqlite3.Cursor:
    """The window's ``host_intervals`` rows in time order: ts_start, ts_end, offcpu_ns,
    page_allocs, block_io_count, block_io_p99_ns, tcp_retransmits."""
    return conn.execute(
        "SELECT ts_start, ts_end, offcpu_ns, page_allocs, block_io_count, block_io_p99_ns,"
        " tcp_retransmits FROM host_intervals WHERE ts_end > ? AND ts_end <= ?"
        " ORDER BY ts_end",
        (start, end),
    )


def gpu_rows(
    conn: sqlite3.Connection, start: float, end: float
) -> tuple[list[str], sqlite3.Cursor]:
    """The window's ``gpu_intervals`` rows in time order: ts_start, ts_end, gpu, busy_ns,
    then the throttle columns the DB has (returned first, by name), then its XID columns."""
    names = {str(row[1]) for row in conn.execute("PRAGMA table_info(gpu_intervals)")}
    throttle_cols = [n for n in _THROTTLE_COLUMNS if n in names]
    xid_cols = [n for n in _XID_COLUMNS if n in names]
    extra = "".join(f', "{c}"' for c in (*throttle_cols, *xid_cols))
    rows = conn.execute(
        f"SELECT ts_start, ts_end, gpu, busy_ns{extra} FROM gpu_intervals"
        " WHERE ts_end > ? AND ts_end <= ? ORDER BY ts_end",
        (start, end),
    )
    return throttle_cols, rows
