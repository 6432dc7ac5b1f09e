"""Node DBs of one job's ranks on three nodes with one NCCL communicator, at any node DB
schema version, built by the node DB's own migrations (``MIGRATIONS[:version]``).

gpu1 (rank 0) reaches every collective 40 ms after the others; gpu3's clock runs
``skew_s`` ahead. ``missing`` names the collectives (by number) a node's sample lacks.
``how`` is where a node's calls are written: ``raw`` (``raw_events``, with ``seq`` in
``detail`` from version 3, as the tracer writes them), ``calls`` (``nccl_calls`` only) or
``both`` (the same calls in both tables).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import sqlite_utils

from ingero.nodedb.schema import MIGRATIONS
from ingero.sqlite import sqlitemigrate

T0 = 1_700_000_000.0
COMM = "9f1c2e3d4b5a6978"
COLLECTIVES = 12
PERIOD_S = 1.0
LATE_S = 0.04
NODES = ("gpu1", "gpu2", "gpu3")


def node_db(
    path: Path,
    node: str,
    *,
    version: int = 3,
    how: str = "raw",
    missing: Collection[int] = (),
    skew_s: float = 0.0,
    in_flight: bool = False,
) -> Path:
    """One node's DB (see the module); ``in_flight``: its last collective has not returned."""
    rank = NODES.index(node)
    pid = 4000 + rank
    conn = sqlite3.connect(path)
    sqlitemigrate.migrate(sqlite_utils.Database(conn), MIGRATIONS[:version])
    rows: dict[str, list[dict[str, Any]]] = {"intervals": [], "raw_events": [], "nccl_calls": []}
    for k in range(COLLECTIVES + 3):
        a = T0 + skew_s + k * PERIOD_S
        rows["intervals"].append(
            {"ts_start": a, "ts_end": a + PERIOD_S, "pid": pid, "job_id": "77", "rank": rank,
             "source": "nccl", "op": "ncclAllReduce", "count": 1, "total_ns": 1_000_000}
        )  # fmt: skip
    for seq in range(1, COLLECTIVES + 1):
        if seq in missing:
            continue
        arrivals = [T0 + seq * PERIOD_S + r * 1e-4 + (LATE_S if r == 0 else 0.0) for r in range(3)]
        done = max(arrivals) + 0.003
        enter = arrivals[rank] + skew_s
        back = None if in_flight and seq == COLLECTIVES else done + skew_s
        detail: dict[str, Any] = {"comm_hash": COMM, "rank": rank, "nranks": 3}
        if version >= 3:
            detail["seq"] = seq
        if how in ("raw", "both") and back is not None:
            rows["raw_events"].append(
                {"ts": back, "pid": pid, "tid": pid, "job_id": "77", "rank": rank,
                 "source": "nccl", "op": "ncclAllReduce",
                 "duration_ns": round((back - enter) * 1e9), "ret": 0, "bytes": 1 << 20,
                 "detail": json.dumps(detail)}
            )  # fmt: skip
        if how in ("calls", "both"):
            rows["nccl_calls"].append(
                {"ts_enter": enter, "ts_return": back, "pid": pid, "tid": pid, "job_id": "77",
                 "rank": rank, "comm_hash": COMM, "comm_rank": rank, "nranks": 3, "seq": seq,
                 "op": "ncclAllReduce", "bytes": 1 << 20, "ret": 0}
            )  # fmt: skip
    rows["processes"] = [
        {"pid": pid, "comm": "python", "exe": "/usr/bin/python3", "job_id": "77", "rank": rank,
         "first_seen": T0, "last_seen": T0 + COLLECTIVES + 3}
    ]  # fmt: skip
    db = sqlite_utils.Database(conn)
    for table, batch in rows.items():
        if batch:
            db.table(table).insert_all(batch)  # a table the version lacks fails here
    conn.close()
    return path


def job(
    root: Path,
    versions: Mapping[str, int],
    how: str = "raw",
    missing: Mapping[str, Collection[int]] | None = None,
    skew_s: float = 0.0,
) -> list[Path]:
    """The three nodes' DBs (``root/gpuN.db``), each at its schema version."""
    root.mkdir(parents=True, exist_ok=True)
    return [
        node_db(
            root / f"{node}.db",
            node,
            version=versions.get(node, 3),
            how=how if versions.get(node, 3) >= 3 else "raw",
            missing=(missing or {}).get(node, ()),
            skew_s=skew_s if node == "gpu3" else 0.0,
        )
        for node in NODES
    ]
