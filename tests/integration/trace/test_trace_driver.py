"""Driver API probes (libcuda.so.1), against a stand-in library with the real signatures."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.integration.trace.conftest import finish, wait_rows

pytestmark = pytest.mark.integration

ITERS = 700
# op → bytes per call in driver_loop.c
OPS = {
    "cuStreamBeginCapture": 0,
    "cuStreamEndCapture": 0,
    "cuGraphInstantiate": 0,
    "cuGraphLaunch": 0,
    "cuMemAlloc": 1 << 20,
    "cuMemcpyHtoD": 4096,
    "cuMemcpyDtoH": 512,
    "cuLaunchKernel": 0,
    "cuLaunchKernelEx": 0,
    "cuLaunchCooperativeKernel": 0,
    "cuCtxSynchronize": 0,
    "cuStreamSynchronize": 0,
}
# Calls per iteration where not one: a captured graph is replayed twice.
CALLS = {"cuGraphLaunch": 2}


def test_driver_calls(start_tracer: Any, spawn: Any, driver_loop: Path) -> None:
    workload = spawn([str(driver_loop), str(ITERS)])
    tracer = start_tracer("--pid", str(workload.pid), "--sample-every", "1")
    codes = finish(workload)
    sql = "SELECT SUM(count) FROM intervals WHERE pid = ? AND op = 'cuStreamSynchronize'"
    assert wait_rows(tracer.db, sql, (workload.pid,), ITERS, tracer.notify) == ITERS
    code, err = tracer.stop()
    assert code == 0, err
    conn = sqlite3.connect(tracer.db)
    try:
        rows = {
            op: (source, n, b, e)
            for op, source, n, b, e in conn.execute(
                "SELECT op, source, SUM(count), SUM(bytes), SUM(errors) FROM intervals "
                "WHERE pid = ? GROUP BY op",
                (workload.pid,),
            )
        }
        rets = dict(conn.execute(
            "SELECT op, MAX(ret) FROM raw_events WHERE pid = ? GROUP BY op", (workload.pid,)
        ).fetchall())  # fmt: skip
        streams = conn.execute(
            "SELECT stream, SUM(syncs), SUM(launches) FROM stream_intervals WHERE pid = ?"
            " GROUP BY stream",
            (workload.pid,),
        ).fetchall()
    finally:
        conn.close()
    for op, size in OPS.items():
        # cuMemAlloc and cuMemAlloc_v2 share one address: counted once per call; the
        # _ptsz entry points are folded into their op.
        n = ITERS * CALLS.get(op, 1)
        assert rows[op] == ("cuda_driver", n, n * size, n), op
        assert rets[op] == int(codes[op]) == 999, op
    # Everything runs on the default stream (handle 0): its syncs, and the launches that
    # name a stream (cuLaunchKernel, cuLaunchCooperativeKernel; not cuLaunchKernelEx, which
    # driver_loop calls with no config: a NULL config names no stream).
    assert streams == [("0000000000000000", ITERS, 2 * ITERS)]
