"""The real tracer against the real libnccl (nvidia-nccl-cu13 wheel, ~300 MB, cached)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from ingero.trace.decode import unique_id_hash
from tests.integration.trace.conftest import finish, wait_rows

pytestmark = pytest.mark.integration

ITERS = 400
NRANKS, RANK = 4, 2
# op → (bytes per call, datatype) in nccl_loop.c.
COLLECTIVES = {
    "ncclAllReduce": (1000 * 4, "float32"),
    "ncclSend": (256 * 8, "int64"),
    "ncclBroadcast": (300 * 2, "float16"),
    "ncclAllGather": (64 * 1, "uint8"),
}


def _query(db: Path, sql: str, *args: object) -> list[sqlite3.Row]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def test_nccl_collectives_and_communicator(start_tracer: Any, spawn: Any, nccl_loop: Path) -> None:
    workload = spawn([str(nccl_loop), str(ITERS), str(NRANKS), str(RANK)])
    tracer = start_tracer("--pid", str(workload.pid))
    out = finish(workload)
    sql = "SELECT SUM(count) FROM intervals WHERE pid = ? AND op = 'ncclCommDestroy'"
    assert wait_rows(tracer.db, sql, (workload.pid,), 1, tracer.notify) == 1
    code, err = tracer.stop()
    assert code == 0, err

    rows = {
        r["op"]: r
        for r in _query(
            tracer.db,
            "SELECT op, source, SUM(count) n, SUM(bytes) b, SUM(errors) e FROM intervals "
            "WHERE pid = ? GROUP BY op",
            workload.pid,
        )
    }
    for op, (size, _) in COLLECTIVES.items():
        # Exactly ITERS: ncclX and pncclX share an address and only one is probed.
        assert rows[op]["n"] == ITERS, op
        assert rows[op]["b"] == ITERS * size, op
        assert rows[op]["source"] == "nccl"
        assert rows[op]["e"] == (ITERS if int(out[op]) != 0 else 0), op
    assert rows["ncclCommInitRank"]["n"] == 1
    # Group start and end (an empty group): probed on the real library, every call sampled.
    for op in ("ncclGroupStart", "ncclGroupEnd"):
        assert rows[op]["n"] == ITERS, op
        assert rows[op]["e"] == (ITERS if int(out[op]) != 0 else 0), op
        (n,) = _query(tracer.db, "SELECT COUNT(*) FROM raw_events WHERE pid = ? AND op = ?",
                      workload.pid, op)[0]  # fmt: skip
        assert n == ITERS, op
    # No live communicator without a GPU: nothing is numbered, so no nccl_comms rows.
    assert _query(tracer.db, "SELECT COUNT(*) FROM nccl_comms")[0][0] == 0

    # Every NCCL call is sampled, with its datatype.
    for op, (size, dtype) in COLLECTIVES.items():
        samples = _query(tracer.db, "SELECT ret, bytes, detail FROM raw_events "
                         "WHERE pid = ? AND op = ?", workload.pid, op)  # fmt: skip
        assert len(samples) == ITERS, op
        assert {(s["ret"], s["bytes"]) for s in samples} == {(int(out[op]), size)}, op
        assert {json.loads(s["detail"])["datatype"] for s in samples} == {dtype}, op

    # Communicator init: rank and nranks from the registers, the id hash from the stack.
    (init,) = _query(tracer.db, "SELECT ret, detail FROM raw_events "
                     "WHERE pid = ? AND op = 'ncclCommInitRank'", workload.pid)  # fmt: skip
    detail = json.loads(init["detail"])
    assert init["ret"] == int(out["ncclCommInitRank"])
    assert detail["rank"] == RANK
    assert detail["nranks"] == NRANKS
    assert detail["comm_hash"] == f"{unique_id_hash(bytes.fromhex(out['id'])):016x}"
