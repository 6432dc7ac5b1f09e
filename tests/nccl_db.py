"""A node DB with the NCCL tables of node DB schema version 3 (``nccl_calls``,
``nccl_comms``), for the fleet-push tests and bench until the tracer's migration creates them:
the columns and meanings are the tracer's (docs/design.md, node DB), created here only where
the node DB does not have them yet."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ingero.nodedb.schema import connect

NCCL_DDL = """
CREATE TABLE IF NOT EXISTS nccl_calls (
    ts_enter REAL NOT NULL, ts_return REAL, pid INTEGER NOT NULL, tid INTEGER,
    job_id TEXT, rank INTEGER, comm_hash TEXT NOT NULL, comm_rank INTEGER NOT NULL,
    nranks INTEGER NOT NULL, seq INTEGER NOT NULL, op TEXT NOT NULL, bytes INTEGER,
    ret INTEGER
);
CREATE INDEX IF NOT EXISTS nccl_calls_ts_enter ON nccl_calls (ts_enter);
CREATE INDEX IF NOT EXISTS nccl_calls_comm_seq ON nccl_calls (comm_hash, seq);
CREATE TABLE IF NOT EXISTS nccl_comms (
    ts REAL NOT NULL, pid INTEGER NOT NULL, job_id TEXT, rank INTEGER,
    comm_hash TEXT NOT NULL, comm_rank INTEGER NOT NULL, nranks INTEGER NOT NULL,
    calls INTEGER NOT NULL, entered_seq INTEGER NOT NULL, returned_seq INTEGER NOT NULL,
    last_enter_ts REAL, inflight_seq INTEGER, inflight_op TEXT, inflight_since REAL,
    wait_ns INTEGER NOT NULL, sampled INTEGER NOT NULL, dropped INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS nccl_comms_ts ON nccl_comms (ts);
"""

COMM_COLUMNS = [
    "ts",
    "pid",
    "job_id",
    "rank",
    "comm_hash",
    "comm_rank",
    "nranks",
    "calls",
    "entered_seq",
    "returned_seq",
    "last_enter_ts",
    "inflight_seq",
    "inflight_op",
    "inflight_since",
    "wait_ns",
    "sampled",
    "dropped",
]
CALL_COLUMNS = [
    "ts_enter",
    "ts_return",
    "pid",
    "tid",
    "job_id",
    "rank",
    "comm_hash",
    "comm_rank",
    "nranks",
    "seq",
    "op",
    "bytes",
    "ret",
]


def nccl_node_db(path: Path) -> sqlite3.Connection:
    """A writer connection to a node DB (created, migrated) that has the NCCL tables."""
    db = connect(path)
    db.conn.executescript(NCCL_DDL)
    return db.conn


def _insert(
    conn: sqlite3.Connection, table: str, columns: list[str], rows: Iterable[dict[str, Any]]
) -> None:
    marks = ", ".join("?" for _ in columns)
    conn.executemany(
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})",
        [tuple(row.get(c) for c in columns) for row in rows],
    )
    conn.commit()


def add_comms(conn: sqlite3.Connection, rows: Iterable[dict[str, Any]]) -> None:
    """``nccl_comms`` rows; counts left out are 0."""
    full = [
        {"calls": 0, "returned_seq": 0, "wait_ns": 0, "sampled": 0, "dropped": 0, **r} for r in rows
    ]
    _insert(conn, "nccl_comms", COMM_COLUMNS, full)


def add_calls(conn: sqlite3.Connection, rows: Iterable[dict[str, Any]]) -> None:
    _insert(conn, "nccl_calls", CALL_COLUMNS, rows)


def rank_interval(
    conn: sqlite3.Connection,
    *,
    end: float,
    pid: int,
    comm_hash: str,
    comm_rank: int,
    nranks: int,
    first_seq: int,
    count: int,
    period: float,
    lag: float = 0.0,
    op: str = "ncclAllReduce",
    size: int = 1 << 20,
) -> None:
    """One tracer interval of one rank ending at ``end``: ``count`` collectives from
    ``first_seq``, one per ``period`` seconds, entered ``lag`` seconds late, each 1 ms long,
    and its ``nccl_comms`` row."""
    start = end - count * period
    calls = [
        {
            "ts_enter": start + i * period + lag,
            "ts_return": start + i * period + lag + 0.001,
            "pid": pid,
            "tid": pid,
            "comm_hash": comm_hash,
            "comm_rank": comm_rank,
            "nranks": nranks,
            "seq": first_seq + i,
            "op": op,
            "bytes": size,
            "ret": 0,
        }
        for i in range(count)
    ]
    add_calls(conn, calls)
    last = first_seq + count - 1
    add_comms(
        conn,
        [
            {
                "ts": end,
                "pid": pid,
                "comm_hash": comm_hash,
                "comm_rank": comm_rank,
                "nranks": nranks,
                "calls": count,
                "entered_seq": last,
                "returned_seq": last,
                "last_enter_ts": calls[-1]["ts_enter"] if calls else None,
                "wait_ns": count * 1_000_000,
                "sampled": count,
            }
        ],
    )
