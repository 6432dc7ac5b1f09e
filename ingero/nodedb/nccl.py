"""Reads of the NCCL tables: ``nccl_calls`` and ``nccl_comms`` (node DB v3) and the sampled
NCCL calls in ``raw_events`` (``source`` nccl; ``detail`` holds the communicator, the rank
in it and, from v3, ``seq``). Written by :mod:`ingero.nodedb.writer` (the tracer's
batches; docs/design.md, "Node DB", version 3).

- ``ingero explain``: a window's sampled collectives, and the ranks in flight with the
  calls they have not returned from (:func:`raw_calls`, :func:`numbered_calls`,
  :func:`in_flight`);
- ``ingero explain --nodes``: the statements each node runs through ``ingero query``
  (:func:`nccl_sql`, :func:`nccl_calls_sql`);
- fleet-push (``ingero.push.collectives``): per push, the newest ``nccl_comms`` row per
  rank and the ``nccl_calls`` rows written since the previous push, by rowid.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import sqlite_utils

from ingero.nodedb.tables import job_filter

CALLS_TABLE = "nccl_calls"
COMMS_TABLE = "nccl_comms"
# The nccl_calls columns a collective is read from (explain's ``numbered_collective``).
NCCL_CALL_COLUMNS = ("ts_enter", "ts_return", "pid", "comm_rank", "rank", "op", "comm_hash", "seq")
# The raw_events columns an NCCL call is read from, on every node (see ``nccl_sql``).
NCCL_COLUMNS = ("ts", "duration_ns", "pid", "rank", "op", "detail")


def nccl_sql(start: float, end: float) -> str:
    """The sampled NCCL calls of ``(start, end]`` (both are numbers: no quoting involved)."""
    return (
        f"SELECT {', '.join(NCCL_COLUMNS)} FROM raw_events WHERE source = 'nccl'"
        f" AND ts > {float(start)!r} AND ts <= {float(end)!r} ORDER BY ts"
    )


def nccl_calls_sql(start: float, end: float) -> str:
    """The numbered collectives (``nccl_calls``, node DB v3) that arrived in ``(start, end]``."""
    return (
        f"SELECT {', '.join(NCCL_CALL_COLUMNS)} FROM nccl_calls"
        f" WHERE ts_enter > {float(start)!r} AND ts_enter <= {float(end)!r} ORDER BY ts_enter"
    )


def raw_calls(
    conn: sqlite3.Connection, start: float, end: float, job_id: str | None
) -> sqlite3.Cursor:
    """The NCCL ``raw_events`` of ``(start, end]`` in time order, ``NCCL_COLUMNS``."""
    job_sql, job_args = job_filter(job_id)
    return conn.execute(
        "SELECT ts, duration_ns, pid, rank, op, detail FROM raw_events"
        f" WHERE source = 'nccl' AND ts > ? AND ts <= ? {job_sql} ORDER BY ts",
        (start, end, *job_args),
    )


def numbered_calls(
    db: sqlite_utils.Database, start: float, end: float, job_id: str | None
) -> list[Any] | sqlite3.Cursor:
    """The ``nccl_calls`` that arrived in ``(start, end]`` in arrival order,
    ``NCCL_CALL_COLUMNS``; none before node DB v3."""
    if "nccl_calls" not in db.table_names():
        return []
    job_sql, job_args = job_filter(job_id)
    cols = ", ".join(NCCL_CALL_COLUMNS)
    return db.conn.execute(
        f"SELECT {cols} FROM nccl_calls WHERE ts_enter > ? AND ts_enter <= ? {job_sql}"
        " ORDER BY ts_enter",
        (start, end, *job_args),
    )


def in_flight(
    db: sqlite_utils.Database,
    start: float,
    end: float,
    job_id: str | None,
    ranks: int,
    calls: int,
) -> tuple[bool, list[tuple[Any, list[Any]]]] | None:
    """Each rank's newest ``nccl_comms`` row of ``(start, end]`` (pid, rank, comm_hash,
    comm_rank, nranks, ts, entered_seq, inflight_seq; the newest ``ranks``), each with the
    ``nccl_calls`` rows (seq, op, ts_enter, stack_key) not returned from its oldest
    collective in flight on, at most ``calls``; and whether those calls carry stacks.
    None before node DB v3."""
    if not {"nccl_calls", "nccl_comms"} <= set(db.table_names()):
        return None
    job_sql, job_args = job_filter(job_id)
    conn = db.conn
    # SQLite takes the bare columns from the max(ts) row of each group.
    newest = conn.execute(
        "SELECT pid, rank, comm_hash, comm_rank, nranks, max(ts), entered_seq, inflight_seq"
        f" FROM nccl_comms WHERE ts > ? AND ts <= ? {job_sql} GROUP BY pid, comm_hash"
        " ORDER BY max(ts) DESC LIMIT ?",
        (start, end, *job_args, ranks),
    ).fetchall()
    keyed = "stack_key" in {str(r[1]) for r in conn.execute("PRAGMA table_info(nccl_calls)")}
    out: list[tuple[Any, list[Any]]] = []
    for row in newest:
        pid, _, comm, _, _, ts, entered, inflight = row
        if inflight is None:
            out.append((row, []))
            continue
        found = conn.execute(
            f"SELECT seq, op, ts_enter, {'stack_key' if keyed else 'NULL'} FROM nccl_calls"
            " WHERE comm_hash = ? AND seq >= ? AND seq <= ? AND pid = ? AND ts_return IS NULL"
            " AND ts_enter <= ? ORDER BY seq LIMIT ?",
            (comm, inflight, entered, pid, ts, calls),
        ).fetchall()
        out.append((row, found))
    return keyed, out


# fleet-push, per push. Newest row per rank of a communicator (SQLite takes the bare columns
# from the max(ts) row), with the interval counts summed over the rows written since the
# previous push.
_COMMS_SQL = f"""
SELECT pid, comm_hash, comm_rank, max(ts) AS ts, nranks, entered_seq, returned_seq,
       last_enter_ts, inflight_seq, inflight_op, inflight_since,
       sum(CASE WHEN rowid > :cursor THEN calls ELSE 0 END) AS calls,
       sum(CASE WHEN rowid > :cursor THEN wait_ns ELSE 0 END) AS wait_ns,
       sum(CASE WHEN rowid > :cursor THEN dropped ELSE 0 END) AS dropped
FROM {COMMS_TABLE} WHERE ts > :since
GROUP BY pid, comm_hash, comm_rank
ORDER BY ts DESC LIMIT :limit
"""
# The calls read this push: written since the previous one, the newest ``limit``.
_READ_SQL = f"""
SELECT rowid, pid, comm_hash, comm_rank, seq, op, ts_enter, ts_return, bytes
FROM {CALLS_TABLE} WHERE rowid > ? AND ts_enter > ? ORDER BY rowid DESC LIMIT ?
"""
# Per rank of the calls read: their seqs, so they are sampled before the calls are read.
_SEQS_SQL = f"""
SELECT pid, comm_hash, comm_rank, count(*) AS n, min(rowid) AS first, group_concat(seq) AS seqs
FROM ({_READ_SQL}) GROUP BY pid, comm_hash, comm_rank
"""
# The highest seq each rank wrote before the first push (which reads no calls).
_REACHED_SQL = f"""
SELECT pid, comm_hash, comm_rank, max(seq) AS seq FROM {CALLS_TABLE}
WHERE rowid <= ? AND ts_enter > ? GROUP BY pid, comm_hash, comm_rank
"""
# The picked calls of one communicator (its ranks share the picked seqs), through
# the tracer's (comm_hash, seq) index.
_PICKED_SQL = f"""
SELECT pid, comm_hash, comm_rank, seq, op, ts_enter, ts_return, bytes FROM {CALLS_TABLE}
WHERE comm_hash = ? AND rowid >= ? AND seq IN (SELECT value FROM json_each(?))
"""
# A read of the calls: (rowids already read, arrivals after, at most this many).
Read = tuple[int, float, int]


def has_tables(conn: sqlite3.Connection) -> bool:
    """Both NCCL tables are there (a node DB without NCCL tracing, or before v3, has none)."""
    tables = {
        name
        for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN (?, ?)",
            (CALLS_TABLE, COMMS_TABLE),
        )
    }
    return tables == {CALLS_TABLE, COMMS_TABLE}


def top_rowids(conn: sqlite3.Connection) -> tuple[int, int]:
    """The highest rowid of ``nccl_calls`` and of ``nccl_comms`` (0: empty)."""
    calls_top = conn.execute(f"SELECT coalesce(max(rowid), 0) FROM {CALLS_TABLE}")
    comms_top = conn.execute(f"SELECT coalesce(max(rowid), 0) FROM {COMMS_TABLE}")
    return int(calls_top.fetchone()[0]), int(comms_top.fetchone()[0])


def reached(conn: sqlite3.Connection, calls: int, since: float) -> sqlite3.Cursor:
    """Per rank (pid, comm_hash, comm_rank): the highest ``seq`` written by rowid ``calls``
    that arrived after ``since``."""
    return conn.execute(_REACHED_SQL, (calls, since))


def newest_comms(conn: sqlite3.Connection, comms: int, since: float, limit: int) -> list[Any]:
    """The newest ``nccl_comms`` row per rank written after ``since`` (at most ``limit``),
    with calls, wait_ns and dropped summed over the rows past rowid ``comms``."""
    return conn.execute(_COMMS_SQL, {"cursor": comms, "since": since, "limit": limit}).fetchall()


def call_seqs(conn: sqlite3.Connection, read: Read) -> sqlite3.Cursor:
    """Per rank of the calls ``read``: n, the lowest rowid (first) and the seqs (comma
    separated)."""
    return conn.execute(_SEQS_SQL, read)


def unsent(conn: sqlite3.Connection, read: Read) -> sqlite3.Cursor:
    """Per rank (pid, comm_hash, comm_rank, n): the calls written since rowid ``read[0]``
    that a read cut at ``read[2]`` rows left out (older than the oldest it read)."""
    first_read = conn.execute(f"SELECT min(rowid) FROM ({_READ_SQL})", read).fetchone()[0]
    return conn.execute(
        f"SELECT pid, comm_hash, comm_rank, count(*) AS n FROM {CALLS_TABLE}"
        " WHERE rowid > ? AND rowid < ? GROUP BY pid, comm_hash, comm_rank",
        (read[0], first_read),
    )


def picked(conn: sqlite3.Connection, comm_hash: str, first: int, seqs: str) -> sqlite3.Cursor:
    """The calls of ``comm_hash`` from rowid ``first`` on whose seq is in ``seqs`` (a JSON
    list)."""
    return conn.execute(_PICKED_SQL, (comm_hash, first, seqs))
