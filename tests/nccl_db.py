"""A node DB with the NCCL tables of node DB schema version 3 (``nccl_calls``,
``nccl_comms``) and helpers that fill them as ``ingero trace`` does, for the fleet-push
tests and bench. The tables are the node DB's own migration's (ingero.nodedb.schema): the
columns written are read from the migrated tables, so the helpers follow the schema."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ingero.nodedb.schema import connect


def nccl_node_db(path: Path) -> sqlite3.Connection:
    """A writer connection to a node DB, created and migrated by the tracer's migration."""
    return connect(path).conn


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [str(row[1]) for row in conn.execute(f"PRAGMA table_info({table})")]


def _insert(conn: sqlite3.Connection, table: str, rows: Iterable[dict[str, Any]]) -> None:
    batch = list(rows)
    columns = _columns(conn, table)
    unknown = {key for row in batch for key in row} - set(columns)
    if unknown:  # a helper's column the migration does not have: the helper is stale
        raise KeyError(f"{table} has no column(s) {sorted(unknown)}")
    marks = ", ".join("?" for _ in columns)
    conn.executemany(
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})",
        [tuple(row.get(c) for c in columns) for row in batch],
    )
    conn.commit()


def add_comms(conn: sqlite3.Connection, rows: Iterable[dict[str, Any]]) -> None:
    """``nccl_comms`` rows; counts left out are 0."""
    full = [
        {"calls": 0, "returned_seq": 0, "wait_ns": 0, "sampled": 0, "dropped": 0, **r} for r in rows
    ]
    _insert(conn, "nccl_comms", full)


def add_calls(conn: sqlite3.Connection, rows: Iterable[dict[str, Any]]) -> None:
    _insert(conn, "nccl_calls", rows)


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
