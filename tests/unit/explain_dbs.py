"""Node DBs for the explain/query tests, written through the workload generator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ingero.nodedb.schema import connect
from ingero.workload.generator import WorkloadGenerator, WorkloadProfile

T0 = 1_700_000_000.0
TICK_S = 5.0


def workload_db(
    path: Path,
    *,
    t0: float = T0,
    ticks: int = 120,
    slow_from: int | None = None,
    slowdown: float = 0.3,
    job_id: str = "77",
    rank: int = 0,
    pid: int = 4242,
    extra_intervals: list[dict[str, Any]] | None = None,
    gpus: bool = True,
) -> Path:
    """``ticks`` intervals of ``TICK_S`` from ``t0``; the slowdown applies from tick ``slow_from``."""
    db = connect(path)
    gen = WorkloadGenerator(WorkloadProfile(job_id=job_id, rank=rank, pid=pid), seed=7)
    with db.conn:
        for i in range(ticks):
            slow = slowdown if slow_from is not None and i >= slow_from else 0.0
            rows = gen.tick(t0 + TICK_S * i, t0 + TICK_S * (i + 1), slow)
            db.table("intervals").insert_all(rows.intervals)
            if gpus:
                db.table("gpu_intervals").insert_all(rows.gpu_intervals)
                db.table("gpu_processes").insert_all(rows.gpu_processes)
            db.table("host_intervals").insert_all(rows.host_intervals)
        if extra_intervals:
            db.table("intervals").insert_all(extra_intervals)
        db.table("processes").upsert(
            {
                "pid": pid,
                "comm": "train.py",
                "exe": "/usr/bin/python3",
                "job_id": job_id,
                "rank": rank,
                "first_seen": t0,
                "last_seen": t0 + TICK_S * ticks,
            },
            pk="pid",
        )
    db.conn.close()
    return path


def op_interval(
    ts_end: float, op: str, count: int, p95_ns: int, *, source: str = "cuda_runtime",
    errors: int = 0, pid: int = 4242, job_id: str = "77",
) -> dict[str, Any]:  # fmt: skip
    """One interval row of ``TICK_S`` ending at ``ts_end`` for ``op``."""
    p50 = p95_ns // 2
    return {
        "ts_start": ts_end - TICK_S,
        "ts_end": ts_end,
        "pid": pid,
        "job_id": job_id,
        "rank": 0,
        "source": source,
        "op": op,
        "count": count,
        "total_ns": count * p50,
        "p50_ns": p50,
        "p95_ns": p95_ns,
        "p99_ns": p95_ns * 2,
        "errors": errors,
        "bytes": 0,
    }
