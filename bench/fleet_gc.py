"""The cyclic GC's share of Fleet's push path: CPU µs per push, and of it the collector's
per generation, with ``--nodes`` nodes' pushes of one shape ingested in rounds (every node
once a round, a tick after each, as Fleet ticks once per push interval), in this process.

Run: ``.venv/bin/python -m bench.fleet_gc`` (``--nodes 10000 --rounds 3 --shape full``).
What Fleet keeps per node lives between ticks; every object of it that the collector
tracks is walked by each full collection, so what the state holds shows here, not in the
per-push decode figures of ``bench.fleet_compare --decode``.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections import Counter
from typing import Any

from bench.fleet_compare import SHAPES


def main() -> None:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )

    from ingero.fleet.config import FleetConfig, LimitsConfig
    from ingero.fleet.daemon import FleetDaemon

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="full")
    opts = parser.parse_args()
    bodies = SHAPES[opts.shape](0, opts.nodes)
    daemon = FleetDaemon(FleetConfig(limits=LimitsConfig(max_nodes=10 * opts.nodes)))
    parse = ExportMetricsServiceRequest.FromString

    def one_round() -> None:
        for body in bodies:
            daemon.receiver.metrics_request(parse(body))
        daemon.state.tick()

    one_round()  # every node known, as in steady state
    spent: Counter[int] = Counter()
    count: Counter[int] = Counter()
    started = [0.0]

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.process_time()
        else:
            spent[info["generation"]] += time.process_time() - started[0]
            count[info["generation"]] += 1

    gc.collect()
    gc.callbacks.append(timed)
    start = time.process_time()
    for _ in range(opts.rounds):
        one_round()
    total = time.process_time() - start
    gc.callbacks.remove(timed)
    pushes = opts.rounds * opts.nodes
    print(
        f"# {opts.nodes:,} nodes, {opts.shape} push, {opts.rounds} rounds; "
        f"GC tracks {len(gc.get_objects()):,} objects"
    )
    print(f"CPU us per push (ingest and ticks): {total / pushes * 1e6:.1f}")
    print(f"of it the cyclic GC: {sum(spent.values()) / pushes * 1e6:.1f}")
    for gen in sorted(count):
        print(f"  generation {gen}: {count[gen]} collections, {spent[gen] / pushes * 1e6:.1f} us")


if __name__ == "__main__":
    main()
