"""Reads of the ``stacks`` table (node DB v4) and of the sampled calls that refer to it
(``raw_events.stack_key``, ``nccl_calls.stack_key``): the call sites ``ingero explain``
and ``ingero query --sites`` show. In a merged DB the stacks of one node are read by node.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

import sqlite_utils

from ingero.nodedb.tables import job_filter
from ingero.schema.stacks import Stack, StackError, loads

# Sampled calls read for call sites: the window's newest. Shares are estimated from them;
# the bound keeps explain's time flat however many calls a window holds.
SITE_ROWS = 200_000
_KEYS_PER_QUERY = 500  # SQLite's bound on host parameters is 32766 (999 before 3.32)

# `ingero query --sites`: call sites per op, from each op's sampled calls (raw_events: the
# newest SITE_ROWS, as explain reads them, so the answer comes within --timeout on any node
# DB) and the stacks they refer to. ``share`` is of the op's sampled calls, with a stack or
# not; ops with the most sampled time first. Parameters: since, SITE_ROWS, sites per op,
# limit.
SITES_SQL = """
WITH calls AS (
  SELECT source, op, stack_key, duration_ns FROM raw_events WHERE ts > ?
  ORDER BY ts DESC LIMIT ?
), per AS (
  SELECT source, op, stack_key, COUNT(*) AS samples,
         SUM(COALESCE(duration_ns, 0)) AS sampled_ns
  FROM calls GROUP BY source, op, stack_key
), ranked AS (
  SELECT source, op, stack_key, samples, sampled_ns,
         samples * 1.0 / SUM(samples) OVER (PARTITION BY source, op) AS share,
         SUM(sampled_ns) OVER (PARTITION BY source, op) AS op_ns,
         ROW_NUMBER() OVER (PARTITION BY source, op
                            ORDER BY stack_key IS NULL, sampled_ns DESC, samples DESC,
                                     stack_key) AS site
  FROM per
)
SELECT r.source, r.op, r.site, r.samples, r.sampled_ns, ROUND(r.share, 4) AS share,
       s.frames AS "where", r.stack_key
FROM ranked r JOIN (SELECT stack_key, MIN(frames) AS frames FROM stacks GROUP BY stack_key) s
  ON s.stack_key = r.stack_key
WHERE r.site <= ?
ORDER BY r.op_ns DESC, r.source, r.op, r.site
LIMIT ?
"""


def has_stacks(db: sqlite_utils.Database) -> bool:
    """Node DB v4 (or a merged DB of one): a ``stacks`` table and ``raw_events.stack_key``."""
    names = {str(r[1]) for r in db.conn.execute("PRAGMA table_info(raw_events)")}
    return "stack_key" in names and "stacks" in db.table_names()


def raw_sites(
    conn: sqlite3.Connection, start: float, end: float, job_id: str | None
) -> sqlite3.Cursor:
    """(source, op, pid, stack_key, samples, sampled ns) of the ``raw_events`` of
    ``(start, end]``, the newest SITE_ROWS of them."""
    job_sql, job_args = job_filter(job_id)
    return conn.execute(
        "SELECT source, op, pid, stack_key, COUNT(*), SUM(COALESCE(duration_ns, 0)) FROM"
        " (SELECT source, op, pid, stack_key, duration_ns FROM raw_events"
        f" WHERE ts > ? AND ts <= ? {job_sql} ORDER BY ts DESC LIMIT ?)"
        " GROUP BY source, op, pid, stack_key",
        (start, end, *job_args, SITE_ROWS),
    )


def nccl_sites(
    conn: sqlite3.Connection, start: float, end: float, job_id: str | None
) -> sqlite3.Cursor | None:
    """As :func:`raw_sites`, from the ``nccl_calls`` that arrived in ``(start, end]`` (a
    call's time is its return minus its arrival); None where they carry no stacks."""
    if "stack_key" not in {str(r[1]) for r in conn.execute("PRAGMA table_info(nccl_calls)")}:
        return None
    job_sql, job_args = job_filter(job_id)
    return conn.execute(
        "SELECT 'nccl', op, pid, stack_key, COUNT(*),"
        " SUM(CAST(COALESCE(ts_return - ts_enter, 0) * 1e9 AS INTEGER)) FROM"
        " (SELECT op, pid, stack_key, ts_enter, ts_return FROM nccl_calls"
        f" WHERE ts_enter > ? AND ts_enter <= ? {job_sql} ORDER BY ts_enter DESC LIMIT ?)"
        " GROUP BY op, pid, stack_key",
        (start, end, *job_args, SITE_ROWS),
    )


def read_stacks(db: sqlite_utils.Database, keys: Iterable[str]) -> dict[str, Stack]:
    """The stacks of ``keys`` that the node DB holds and can decode (a damaged row is left
    out: its calls are counted without a site)."""
    out: dict[str, Stack] = {}
    columns, rows = stack_rows(db.conn, keys)
    for row in rows:
        r = dict(zip(columns, row, strict=True))
        try:
            out[str(r["stack_key"])] = loads(str(r["frames"]))
        except StackError:
            continue
    return out


def stack_rows(
    conn: sqlite3.Connection, keys: Iterable[str], node: str | None = None
) -> tuple[list[str], list[tuple[object, ...]]]:
    """The ``stacks`` rows of ``keys`` (of ``node`` in a merged DB), in bounded queries."""
    wanted = sorted(set(keys))
    columns: list[str] = []
    rows: list[tuple[object, ...]] = []
    for i in range(0, len(wanted), _KEYS_PER_QUERY):
        chunk: list[object] = list(wanted[i : i + _KEYS_PER_QUERY])
        where = f"stack_key IN ({', '.join('?' * len(chunk))})"
        if node is not None:
            where, chunk = f"node = ? AND {where}", [node, *chunk]
        cur = conn.execute(f"SELECT * FROM stacks WHERE {where}", chunk)
        columns = [d[0] for d in cur.description]
        rows += cur.fetchall()
    return columns, rows
