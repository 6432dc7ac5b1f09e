"""Cost of Fleet's opt-in per-node series (``metrics.node_series``) at growing fleet sizes.

Run: ``.venv/bin/python -m bench.fleet_node_series`` (``--sizes 10000`` to shorten).
Per size: the tick thread's work (picking ``--limit`` nodes, stragglers first then the
lowest scores, with ``FleetState.scores_snapshot(lowest, first)``, and marking them), the
scrape's rendering of the series, and for comparison a full snapshot of every node's row.
Medians of ``--runs`` repetitions.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from bench.fleet_tick import pushes
from ingero.fleet.config import FleetConfig
from ingero.fleet.metrics import FleetMetrics
from ingero.fleet.state import FleetState
from ingero.runtime.clock import ManualClock


def measure(n: int, limit: int, runs: int) -> str:
    state = FleetState(FleetConfig(), ManualClock())
    for push in pushes(n, np.random.default_rng(7), group_size=64):
        state.ingest(push)
    result = state.tick()
    flagged = {(v.cluster_id, v.node_id) for v in result.verdicts if v.straggler}
    named = {node for _, node in flagged}
    metrics = FleetMetrics(node_series_limit=limit)
    pick, render, full = [], [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        metrics.update_nodes(state.scores_snapshot(limit, named), flagged, n)
        t1 = time.perf_counter()
        metrics.render()
        t2 = time.perf_counter()
        state.scores_snapshot()
        t3 = time.perf_counter()
        pick.append(t1 - t0)
        render.append(t2 - t1)
        full.append(t3 - t2)
    ms = [statistics.median(x) * 1000 for x in (pick, render, full)]
    return (
        f"{n:>8} nodes {len(flagged):>5} stragglers  tick {ms[0]:7.1f} ms  "
        f"scrape {ms[1]:6.1f} ms  (full snapshot {ms[2]:7.1f} ms)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    for size in (int(s) for s in args.sizes.split(",")):
        print(measure(size, args.limit, args.runs), flush=True)


if __name__ == "__main__":
    main()
