"""Cost of Fleet's threshold tick and of one ingest, at growing fleet sizes.

Run: ``.venv/bin/python -m bench.fleet_tick`` (``--sizes 1000,10000`` to shorten).
Nodes are spread over groups of 100 (1,000 groups at 100,000 nodes), then one group per
node (single-node jobs, ``--single-sizes``); 1% are slow so each tick also classifies
stragglers and keeps their episodes. Prints one line per size, then the latency of ingest
calls made from a second thread while ticks run.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import threading
import time

import numpy as np

from ingero.fleet.config import FleetConfig
from ingero.fleet.state import FleetState
from ingero.otlp.health import NodePush
from ingero.runtime.clock import ManualClock

GROUP_SIZE = 100


def pushes(n: int, rng: np.random.Generator, group_size: int = GROUP_SIZE) -> list[NodePush]:
    scores = np.clip(rng.normal(0.9, 0.02, size=n), 0.0, 1.0)
    slow = rng.random(n) < 0.01
    scores[slow] = 0.4
    return [
        NodePush(
            node_id=f"node{i:06d}",
            cluster_id="bench",
            score=float(scores[i]),
            job_id=str(i // group_size),
            rank=i % group_size,
        )
        for i in range(n)
    ]


def measure(n: int, ticks: int, group_size: int = GROUP_SIZE) -> dict[str, float]:
    rng = np.random.default_rng(n)
    clock = ManualClock()
    state = FleetState(FleetConfig(), clock)
    batch = pushes(n, rng, group_size)
    # The daemon does not keep pushes; keep the collector from walking this batch each time.
    gc.freeze()
    for p in batch:
        state.ingest(p)
    state.tick()  # first tick opens the episodes; later ones are the steady state
    tick_s: list[float] = []
    ingest_s: list[float] = []
    for _ in range(ticks):
        clock.advance(5)
        start = time.perf_counter()
        for p in batch:
            state.ingest(p)
        ingest_s.append((time.perf_counter() - start) / n)
        start = time.perf_counter()
        result = state.tick()
        tick_s.append(time.perf_counter() - start)
    return {
        "nodes": n,
        "groups": len(result.groups),
        "stragglers": len(result.verdicts),
        "tick_ms": statistics.median(tick_s) * 1e3,
        "ingest_us": statistics.median(ingest_s) * 1e6,
    }


def ingest_during_ticks(n: int, ticks: int) -> dict[str, float]:
    """Latency of ingest calls from another thread while ticks run back to back."""
    rng = np.random.default_rng(n)
    state = FleetState(FleetConfig(), ManualClock())
    batch = pushes(n, rng)
    gc.freeze()
    for p in batch:
        state.ingest(p)
    latencies: list[float] = []
    done = threading.Event()

    def pusher() -> None:
        i = 0
        while not done.is_set():
            start = time.perf_counter()
            state.ingest(batch[i % n])
            latencies.append(time.perf_counter() - start)
            i += 1

    thread = threading.Thread(target=pusher)
    thread.start()
    try:
        for _ in range(ticks):
            state.tick()
    finally:
        done.set()
        thread.join()
    ordered = sorted(latencies)
    return {
        "calls": len(ordered),
        "p50_us": ordered[len(ordered) // 2] * 1e6,
        "p99_us": ordered[int(len(ordered) * 0.99)] * 1e6,
        "max_ms": ordered[-1] * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--single-sizes", default="10000")
    parser.add_argument("--ticks", type=int, default=5)
    args = parser.parse_args()
    print(f"{'nodes':>8} {'groups':>7} {'stragglers':>10} {'tick ms':>9} {'ingest µs':>10}")
    for size in (int(s) for s in args.sizes.split(",")):
        r = measure(size, args.ticks)
        print(
            f"{r['nodes']:>8.0f} {r['groups']:>7.0f} {r['stragglers']:>10.0f}"
            f" {r['tick_ms']:>9.2f} {r['ingest_us']:>10.2f}"
        )
    # Single-node jobs are the worst case: one group (and one summary) per node.
    for size in (int(s) for s in args.single_sizes.split(",") if s):
        r = measure(size, args.ticks, group_size=1)
        print(
            f"{r['nodes']:>8.0f} {r['groups']:>7.0f} {r['stragglers']:>10.0f}"
            f" {r['tick_ms']:>9.2f} {r['ingest_us']:>10.2f}  (single-node jobs)"
        )
    size = max(int(s) for s in args.sizes.split(","))
    c = ingest_during_ticks(size, args.ticks)
    print(
        f"ingest from a second thread during {args.ticks} ticks at {size} nodes:"
        f" {c['calls']:.0f} calls, p50 {c['p50_us']:.1f} µs, p99 {c['p99_us']:.1f} µs,"
        f" max {c['max_ms']:.2f} ms"
    )


if __name__ == "__main__":
    main()
