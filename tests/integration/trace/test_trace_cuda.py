"""The real tracer (BCC, uprobes on the real libcudart) against a real CUDA test program."""

from __future__ import annotations

import json
import os
import sqlite3
import statistics
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.trace.conftest import finish, wait_rows

pytestmark = pytest.mark.integration

ITERS = 3000
SLEEP_US = 200
# op → bytes per call in cuda_loop.c (0: the call has no size argument).
OPS = {
    "cudaMalloc": 4096,
    "cudaFree": 0,
    "cudaMemcpy": 1024,
    "cudaMemcpyAsync": 2048,
    "cudaLaunchKernel": 0,
    "cudaStreamSynchronize": 0,
    "cudaDeviceSynchronize": 0,
    "cudaMallocManaged": 8192,
    "cudaGraphLaunch": 0,
    "cudaStreamBeginCapture": 0,
    "cudaStreamEndCapture": 0,
}
COUNT_SQL = "SELECT SUM(count) FROM intervals WHERE pid = ? AND op = 'cudaGraphLaunch'"


def _block_backed(path: Path) -> bool:
    """Whether ``path`` lives on a block device (so writes there reach block I/O)."""
    out = subprocess.run(["findmnt", "-no", "SOURCE", "--target", str(path)],
                         capture_output=True, text=True, check=False).stdout  # fmt: skip
    return out.strip().startswith("/dev/")


def _rows(db: Path, sql: str, *args: object) -> list[sqlite3.Row]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def _per_op(db: Path, pid: int) -> dict[str, dict[str, Any]]:
    rows = _rows(
        db,
        "SELECT op, SUM(count) n, SUM(total_ns) total, SUM(errors) errors, SUM(bytes) bytes, "
        "MIN(p50_ns) p50, MAX(p99_ns) p99, MIN(p50_ns <= p95_ns AND p95_ns <= p99_ns) ordered, "
        "MAX(job_id) job, MAX(rank) rank FROM intervals WHERE pid = ? GROUP BY op",
        pid,
    )
    return {r["op"]: dict(r) for r in rows}


def test_cuda_calls_counted_timed_and_sampled(
    start_tracer: Any, spawn: Any, cuda_loop: Path
) -> None:
    workload = spawn([str(cuda_loop), str(ITERS), str(SLEEP_US)])
    tracer = start_tracer("--pid", str(workload.pid), "--sample-every", "8")
    codes = finish(workload)
    got = wait_rows(tracer.db, COUNT_SQL, (workload.pid,), ITERS, tracer.notify)
    assert got == ITERS
    # Block I/O for the host context: synced writes to the disk under the test's tmp dir.
    on_disk = _block_backed(tracer.db.parent)
    if on_disk:
        with open(tracer.db.parent / "io.bin", "wb") as f:
            for _ in range(8):
                f.write(os.urandom(1 << 20))
                f.flush()
                os.fsync(f.fileno())
        wait_rows(tracer.db, "SELECT SUM(block_io_count) FROM host_intervals", (), 1,
                  tracer.notify)  # fmt: skip
    code, err = tracer.stop()
    assert code == 0, err

    per_op = _per_op(tracer.db, workload.pid)
    for op, size in OPS.items():
        row = per_op[op]
        assert row["n"] == ITERS, (op, row)
        assert row["bytes"] == ITERS * size, (op, row)
        # No driver: every call fails with the code the program itself saw.
        expected_errors = ITERS if int(codes[op]) != 0 else 0
        assert row["errors"] == expected_errors, (op, row, codes[op])
        assert row["total"] > 0, (op, row)
        assert row["ordered"] == 1, (op, row)

    raw = _rows(tracer.db, "SELECT op, ret, duration_ns, bytes, tid FROM raw_events WHERE pid = ?",
                workload.pid)  # fmt: skip
    by_op: dict[str, list[sqlite3.Row]] = {}
    for r in raw:
        by_op.setdefault(r["op"], []).append(r)
    sampled = sum(len(v) for k, v in by_op.items() if k in OPS)
    # 1 in 8 calls is sampled (a per-CPU counter, so the split between ops varies).
    assert len(OPS) * ITERS / 8 * 0.9 <= sampled <= len(OPS) * ITERS / 8 * 1.1
    for op, samples in by_op.items():
        if op not in OPS:
            continue
        assert {s["ret"] for s in samples} == {int(codes[op])}, op
        assert {s["bytes"] for s in samples} == {OPS[op]}, op
        assert {s["tid"] for s in samples} == {workload.pid}, op
    # The histogram percentiles agree with the sampled durations (bucket error < 25%).
    durations = [s["duration_ns"] for s in by_op["cudaMalloc"]]
    median = statistics.median(durations)
    row = _rows(tracer.db, "SELECT p50_ns FROM intervals WHERE pid = ? AND op = 'cudaMalloc' "
                "ORDER BY count DESC LIMIT 1", workload.pid)[0]  # fmt: skip
    assert 0.5 * median <= row["p50_ns"] <= 2 * median, (row["p50_ns"], median)
    assert "exit" in by_op, "process exit was not reported"
    # Each sampled call carries its native stack: the caller, main() of the loop program
    # (its ELF symbols), in the loop binary, named through the process's maps.
    stacks = _rows(tracer.db, "SELECT s.frames FROM raw_events r JOIN stacks s USING (stack_key) "
                   "WHERE r.pid = ? AND r.op = 'cudaMalloc'", workload.pid)  # fmt: skip
    assert stacks, "sampled calls without stacks"
    for s in stacks:
        first = json.loads(s["frames"])["frames"][0]
        assert first["kind"] == "native" and first.get("function") == "main", first
        assert first.get("lib") == str(cuda_loop), first

    # Off-CPU: the thread sleeps SLEEP_US per iteration, so it was off-CPU about that long
    # (a sleep whose timer fires before the switch never leaves the CPU, hence the margin).
    off = per_op["offcpu"]
    assert off["n"] >= 0.9 * ITERS
    assert off["total"] >= 0.9 * ITERS * SLEEP_US * 1000
    host = _rows(tracer.db, "SELECT SUM(offcpu_ns) s, SUM(dropped_events) d, "
                 "SUM(page_allocs) pages, SUM(block_io_count) io, MAX(block_io_p99_ns) io99 "
                 "FROM host_intervals")[0]  # fmt: skip
    assert host["s"] >= off["total"]
    assert host["d"] == 0
    assert host["pages"] > 0
    if on_disk:
        assert host["io"] > 0 and host["io99"] > 0


def test_later_processes_caught_and_tagged(start_tracer: Any, spawn: Any, cuda_loop: Path) -> None:
    first = spawn([str(cuda_loop), "10", "0"])
    tracer = start_tracer()
    # Started after the tracer attached: caught because uprobes attach by library path.
    # It runs ~0.5 s: long enough for its tags to be read while it lives.
    env = dict(os.environ, SLURM_JOB_ID="4242", SLURM_PROCID="3")
    later = spawn([str(cuda_loop), "500", "1000"], env=env)
    finish(later)
    finish(first)
    got = wait_rows(tracer.db, COUNT_SQL, (later.pid,), 500, tracer.notify)
    assert got == 500
    wait_rows(tracer.db, COUNT_SQL, (first.pid,), 10, tracer.notify)
    code, err = tracer.stop()
    assert code == 0, err
    later_ops = _per_op(tracer.db, later.pid)
    assert later_ops["cudaMalloc"]["n"] == 500
    assert later_ops["cudaMalloc"]["job"] == "4242"
    assert later_ops["cudaMalloc"]["rank"] == 3
    first_ops = _per_op(tracer.db, first.pid)
    assert first_ops["cudaMalloc"]["n"] == 10
    assert first_ops["cudaMalloc"]["job"] is None
    procs = _rows(tracer.db, "SELECT pid, job_id, rank FROM processes WHERE pid = ?", later.pid)
    assert [tuple(p) for p in procs] == [(later.pid, "4242", 3)]
    details = _rows(tracer.db, "SELECT detail FROM raw_events WHERE pid = ? AND op != 'exit'",
                    later.pid)  # fmt: skip
    assert all(d["detail"] is None or json.loads(d["detail"]) for d in details)
