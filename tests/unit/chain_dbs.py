"""Node DBs shaped like the ones ``ingero trace`` records on a real GPU node, with one cause.

What a real H100 node DB holds for a PyTorch training process (measured,
docs/benchmarks.md#what-ingero-recorded-on-a-real-h100):
kernels launched through the driver API (cuda_driver/cuLaunchKernel, ~19k calls/s at ~6.5 µs,
no cudaLaunchKernel), a rare cudaDeviceSynchronize, cudaMemcpyAsync, a few cuMemAlloc at
start, off-CPU rows per process (source host, op offcpu: ~600 switches/s, ~2 s off-CPU per s
over all threads), host rows every interval, no ``step`` rows and no ``gpu_intervals``
unless a GPU sampler writes them. ``cause`` changes what that cause changes, from
``cause_from`` on; everything else keeps its noise.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ingero.nodedb.schema import connect

T0 = 1_700_000_000.0
TICK_S = 5.0
TICKS = 120  # 10 minutes: two 5-minute windows
END = T0 + TICK_S * TICKS
CAUSES = ("cpu", "io", "alloc", "memcpy", "throttle", "xid", "net", "peer")


@dataclass(frozen=True)
class Proc:
    pid: int = 4242
    comm: str = "python"
    job_id: str = "77"
    rank: int = 0


def _row(
    a: float,
    b: float,
    p: Proc,
    source: str,
    op: str,
    count: int,
    mean_ns: float,
    p95_ns: float,
    nbytes: int = 0,
) -> dict[str, Any]:
    return {
        "ts_start": a,
        "ts_end": b,
        "pid": p.pid,
        "job_id": p.job_id,
        "rank": p.rank,
        "source": source,
        "op": op,
        "count": count,
        "total_ns": int(count * mean_ns),
        "p50_ns": int(mean_ns),
        "p95_ns": int(p95_ns),
        "p99_ns": int(p95_ns * 1.6),
        "errors": 0,
        "bytes": nbytes,
    }


def real_db(
    path: Path,
    cause: str | None = None,
    *,
    cause_from: int = 60,
    procs: tuple[Proc, ...] = (Proc(),),
    cause_pids: tuple[int, ...] | None = None,
    slow_pids: tuple[int, ...] | None = None,
    slow_from: int | None = None,
    gpu_columns: bool = False,
    gpu_rows: bool = False,
    peers: tuple[Proc, ...] = (),
    late_pid: int | None = None,
    skew_s: float = 0.0,
    seed: int = 3,
) -> Path:
    """``TICKS`` intervals of ``TICK_S``; ``cause`` from tick ``cause_from`` on.

    ``cause_pids`` limits a per-process cause to those PIDs (default: all), ``slow_pids`` the
    throughput drop (default: ``cause_pids``);
    ``slow_from`` moves the throughput drop to another tick than the cause's.
    ``peers`` are all ranks of one NCCL communicator (on this node and others): this DB
    samples the collectives of its own ``procs`` among them, ``late_pid`` arriving last
    from ``cause_from`` on (a "peer" cause with several ``procs`` does this on one node).
    ``skew_s`` shifts every time (a node whose clock is that far ahead).
    ``gpu_rows`` writes ``gpu_intervals`` rows; ``gpu_columns`` fills the NVML columns of
    schema version 2 (throttle_reasons, xid_count, xids), which are NULL otherwise.
    """
    if cause is not None and cause not in CAUSES:
        raise ValueError(cause)
    rnd = random.Random(seed)
    slow_from = cause_from if slow_from is None else slow_from
    affected = set(cause_pids or [p.pid for p in procs])
    slowed = set(slow_pids or affected)
    db = connect(path)
    nvml = gpu_columns or cause in ("throttle", "xid")
    intervals: list[dict[str, Any]] = []
    host: list[dict[str, Any]] = []
    gpus: list[dict[str, Any]] = []
    raw: list[dict[str, Any]] = []
    for i in range(TICKS):
        a, b = T0 + skew_s + TICK_S * i, T0 + skew_s + TICK_S * (i + 1)
        on = cause is not None and i >= cause_from
        slow = cause is not None and i >= slow_from

        def noise(x: float) -> float:
            return x * rnd.uniform(0.97, 1.03)

        tick_off = 0
        for p in procs:
            hit = on and p.pid in affected
            drop = slow and p.pid in slowed
            launches = noise(19_500 * TICK_S) * (0.7 if drop else 1.0)
            launch_p95 = noise(18_000) * (3.2 if hit and cause == "cpu" else 1.0)
            intervals.append(
                _row(
                    a,
                    b,
                    p,
                    "cuda_driver",
                    "cuLaunchKernel",
                    int(launches),
                    noise(6_500),
                    launch_p95,
                )
            )
            sync_n = int(noise(16 * TICK_S))
            sync_p95 = noise(24_000) * (2.5 if hit and cause in ("alloc", "throttle") else 1.0)
            intervals.append(
                _row(
                    a,
                    b,
                    p,
                    "cuda_runtime",
                    "cudaDeviceSynchronize",
                    sync_n,
                    noise(20_000),
                    sync_p95,
                )
            )
            copies = int(noise(190 * TICK_S) * (4 if hit and cause == "memcpy" else 1))
            copy_mean = noise(119_000) * (5 if hit and cause == "memcpy" else 1)
            intervals.append(
                _row(
                    a,
                    b,
                    p,
                    "cuda_runtime",
                    "cudaMemcpyAsync",
                    copies,
                    copy_mean,
                    copy_mean * 1.5,
                    copies * 4 << 20,
                )
            )
            if i == 0 or (hit and cause == "alloc"):
                n = 3 if i == 0 else int(noise(220 * TICK_S))
                intervals.append(
                    _row(a, b, p, "cuda_driver", "cuMemAlloc", n, noise(144_000), noise(260_000))
                )
            switches = noise(600 * TICK_S) * (3.0 if hit and cause == "cpu" else 1.0)
            off_s = noise(2.0 * TICK_S) * (2.4 if hit and cause in ("cpu", "io") else 1.0)
            if hit and cause == "io":
                switches *= 1.6
            tick_off += int(off_s * 1e9)
            intervals.append(
                _row(
                    a,
                    b,
                    p,
                    "host",
                    "offcpu",
                    int(switches),
                    off_s * 1e9 / switches,
                    off_s * 1e9 / switches * 4,
                )
            )
            nccl_p95 = noise(900_000) * (3.0 if hit and cause in ("net", "peer") else 1.0)
            intervals.append(
                _row(
                    a,
                    b,
                    p,
                    "nccl",
                    "ncclAllReduce",
                    int(noise(40 * TICK_S)),
                    nccl_p95 / 2,
                    nccl_p95,
                )
            )
        host.append(
            {
                "ts_start": a,
                "ts_end": b,
                "offcpu_ns": tick_off,
                "page_allocs": int(noise(40_000 * TICK_S) * (3 if on and cause == "io" else 1)),
                "block_io_count": int(noise(30 * TICK_S) * (3 if on and cause == "io" else 1)),
                "block_io_p99_ns": int(noise(2e6) * (9 if on and cause == "io" else 1)),
                "tcp_retransmits": int(noise(40) if on and cause == "net" else rnd.random() < 0.1),
                "dropped_events": 0,
            }
        )
        if nvml or gpu_rows:
            row = {
                "ts_start": a,
                "ts_end": b,
                "gpu": 0,
                "busy_ns": int(noise(0.9e9 * TICK_S)),
                "mem_free_bytes": 2 << 30,
                "mem_total_bytes": 80 << 30,
            }
            if nvml:
                # 0x1 (GPU idle) is no slowdown; 0x40 is SW thermal slowdown
                row["throttle_reasons"] = 0x40 if on and cause == "throttle" else 0x1
                xid = on and cause == "xid" and i % 10 == 0
                row["xid_count"] = 1 if xid else 0
                row["xids"] = "[79]" if xid else "[]"
            gpus.append(row)
        if cause == "peer" and len(procs) > 1 and not peers:
            peers, late_pid = procs, procs[-1].pid
        if peers:
            own = {p.pid for p in procs}
            # Seeded by the interval alone: every node's DB sees the same collectives.
            calls = _collectives(
                a, peers, late_pid if i >= cause_from else None, random.Random(int(a - skew_s))
            )
            raw += [c for c in calls if c["pid"] in own]
    with db.conn:
        db.table("intervals").insert_all(intervals)
        db.table("host_intervals").insert_all(host)
        if gpus:
            db.table("gpu_intervals").insert_all(gpus)
        if raw:
            db.table("raw_events").insert_all(raw)
        for p in procs:
            db.table("processes").upsert(
                {
                    "pid": p.pid,
                    "comm": p.comm,
                    "exe": "/usr/bin/python3",
                    "job_id": p.job_id,
                    "rank": p.rank,
                    "first_seen": T0,
                    "last_seen": END,
                },
                pk="pid",
            )
    db.conn.close()
    return path


def _collectives(
    a: float, procs: tuple[Proc, ...], late: int | None, rnd: random.Random
) -> list[dict[str, Any]]:
    """Two ncclAllReduce calls per interval per rank of one communicator (always sampled).

    Every rank arrives within ~0.2 ms of the others; ``late`` arrives 40 ms after them, so
    the others wait (long calls) and the late rank's call is short.
    """
    out = []
    for k in range(2):
        begin = a + 1.0 + 2.0 * k
        arrivals = {
            p.pid: begin + rnd.uniform(0, 2e-4) + (0.04 if p.pid == late else 0.0) for p in procs
        }
        done = max(arrivals.values()) + 0.003
        for p in procs:
            out.append(
                {
                    "ts": done,
                    "pid": p.pid,
                    "tid": p.pid,
                    "job_id": p.job_id,
                    "rank": p.rank,
                    "source": "nccl",
                    "op": "ncclAllReduce",
                    "duration_ns": int((done - arrivals[p.pid]) * 1e9),
                    "ret": 0,
                    "bytes": 1 << 26,
                    "detail": json.dumps(
                        {
                            "comm_hash": "9f1c2e3d4b5a6978",
                            "rank": p.rank,
                            "nranks": len(procs),
                            "datatype": "bfloat16",
                        }
                    ),
                }
            )
    return out
