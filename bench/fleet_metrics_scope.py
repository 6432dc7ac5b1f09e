"""Cost of a scoped token's ``/metrics`` (filtered to its clusters) against the full scrape.

Run: ``.venv/bin/python -m bench.fleet_metrics_scope`` (``--sizes 10000`` to shorten).
Per size: ``--clusters`` tenants share one Fleet (groups of ``--group-size`` nodes, each
group in one cluster, per-node series on with their default limit of 1,000, a clock offset per node up
to the same limit); ``FleetMetrics.render()`` (an unscoped token: Prometheus) against
``render_clusters`` for a token scoped to one cluster and to half of them. Medians of
``--runs`` repetitions, with the size of each answer.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable

import numpy as np

from bench.fleet_tick import pushes
from ingero.clock import ManualClock
from ingero.fleet.config import FleetConfig
from ingero.fleet.metrics import FleetMetrics
from ingero.fleet.state import FleetState

LIMIT = 1000  # metrics.node_series_limit's default


def timed(render: Callable[[], bytes], runs: int) -> tuple[float, int]:
    """Median milliseconds of ``runs`` renders, and the bytes of one."""
    seconds, size = [], 0
    for _ in range(runs):
        t0 = time.perf_counter()
        size = len(render())
        seconds.append(time.perf_counter() - t0)
    return statistics.median(seconds) * 1000, size


def measure(n: int, clusters: int, runs: int, group_size: int) -> str:
    state = FleetState(FleetConfig(), ManualClock())
    for push in pushes(n, np.random.default_rng(7), group_size):
        tenant = f"tenant-{int(push.job_id or 0) % clusters:03d}"
        state.ingest(dataclasses.replace(push, cluster_id=tenant))
    result = state.tick()
    metrics = FleetMetrics(node_series_limit=LIMIT, clock_offset_limit=LIMIT)
    metrics.update_groups(result.groups)
    flagged = {(v.cluster_id, v.node_id) for v in result.verdicts if v.straggler}
    metrics.update_nodes(state.scores_snapshot(LIMIT, {n for _, n in flagged}), flagged, n)
    metrics.update_clock_offsets(
        (row.cluster_id, row.node_id, 0.001, 0.0001) for row in state.scores_snapshot()
    )
    names = sorted({g.cluster_id for g in result.groups})
    one, half = frozenset(names[:1]), frozenset(names[: len(names) // 2])
    full_ms, full_b = timed(metrics.render, runs)
    one_ms, one_b = timed(lambda: metrics.render_clusters(one), runs)
    half_ms, half_b = timed(lambda: metrics.render_clusters(half), runs)
    return (
        f"{n:>7} nodes {len(result.groups):>5} groups {clusters:>3} clusters  "
        f"unscoped {full_ms:6.1f} ms {full_b / 1e6:5.2f} MB  "
        f"1 cluster {one_ms:6.2f} ms {one_b / 1e3:7.1f} kB  "
        f"{len(half)} clusters {half_ms:6.1f} ms {half_b / 1e6:5.2f} MB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--clusters", type=int, default=10)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--group-size", type=int, default=64)
    args = parser.parse_args()
    for size in (int(s) for s in args.sizes.split(",")):
        print(measure(size, args.clusters, args.runs, args.group_size), flush=True)


if __name__ == "__main__":
    main()
