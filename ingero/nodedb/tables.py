"""The node DB's tables as readers see them: which there are (and from which schema
version), the column each one's rows are placed in time by, and the reads of whole rows
that ``ingero query --table``, ``export`` and ``merge`` make of any of them.

A merged DB (``ingero merge``, :mod:`ingero.nodedb.merged`) holds the same tables with a
leading ``node`` column: every read here takes the node where it reads a merged DB.
"""

from __future__ import annotations

import sqlite3
from typing import Any

NODE_TABLES = (
    "intervals",
    "raw_events",
    "host_intervals",
    "gpu_intervals",
    "gpu_processes",
    "processes",
)
# Node DB v3: NCCL collectives per communicator (ingero trace). Older node DBs lack them:
# merge, export and the fan-out carry them where a node DB has them (``OPTIONAL_TABLES``).
NCCL_TABLES = ("nccl_calls", "nccl_comms")
# Node DB v4: one row per distinct call stack; raw_events/nccl_calls.stack_key refer to it.
STACK_TABLES = ("stacks",)
# Node DB v5: what the job marked through ``ingero annotate`` (steps, phases, labels).
MARK_TABLES = ("marks",)
# Node DB v6: per (pid, CUDA stream) syncs, launches and sync-to-sync steps.
STREAM_TABLES = ("stream_intervals",)
QUERY_TABLES = (*NODE_TABLES, *NCCL_TABLES, *STACK_TABLES, *MARK_TABLES, *STREAM_TABLES)
# The tables merge/export/fan-out carry: every node DB has NODE_TABLES; the others only
# from the schema version that added them, so a DB without one gives no rows of it.
CARRIED_TABLES = QUERY_TABLES
OPTIONAL_TABLES = frozenset((*NCCL_TABLES, *STACK_TABLES, *MARK_TABLES, *STREAM_TABLES))
# The column each table's rows are placed in time by (query --since, merge, export).
TIME_COLUMNS = {
    "intervals": "ts_end",
    "raw_events": "ts",
    "host_intervals": "ts_end",
    "gpu_intervals": "ts_end",
    "gpu_processes": "ts_end",
    "processes": "last_seen",
    "nccl_calls": "ts_enter",
    "nccl_comms": "ts",
    "stacks": "last_seen",
    "marks": "ts_start",
    "stream_intervals": "ts_end",
}


def job_filter(job_id: str | None) -> tuple[str, tuple[str, ...]]:
    """The ``AND job_id = ?`` clause and its parameter that keep one Slurm job's rows
    (none when ``job_id`` is None or empty)."""
    return ("AND job_id = ?", (job_id,)) if job_id else ("", ())


def newest_sql(table: str, since: bool) -> str:
    """``ingero query --table``'s statement: the newest rows of ``table`` (one of
    TIME_COLUMNS), parameters (since,) limit when ``since``, else (limit,)."""
    column = TIME_COLUMNS[table]
    where = f" WHERE {column} > ?" if since else ""
    return f"SELECT * FROM {table}{where} ORDER BY {column} DESC LIMIT ?"


def window_rows(
    conn: sqlite3.Connection,
    table: str,
    node: str | None,
    start: float,
    end: float,
    limit: int,
) -> sqlite3.Cursor:
    """The rows of ``table`` placed in ``(start, end]``, the newest ``limit`` (of ``node``
    in a merged DB); ``processes`` whole (a process is not placed in a window)."""
    col = TIME_COLUMNS[table]
    where = "node = ? AND " if node is not None else ""
    args: list[Any] = [node] if node is not None else []
    if table == "processes":
        return conn.execute(
            f"SELECT * FROM processes {'WHERE node = ?' if node is not None else ''}", args
        )
    return conn.execute(
        f"SELECT * FROM {table} WHERE {where}{col} > ? AND {col} <= ? ORDER BY {col} DESC LIMIT ?",
        [*args, start, end, limit],
    )
