"""Push latency of the real ``ingero fleet`` with the drain controller on, while slurmctld
answers and while it is frozen (SIGSTOP: every Slurm call hangs until its timeout).

Needs root and Slurm (tests/apt-packages.txt). Starts the test cluster (4 nodes) and Fleet
(push interval 0.2 s, one node of a 4-node job straggling, drain enabled with
max_fraction 0 so nothing is drained and Slurm is asked every tick), then pushes the 4
nodes over OTLP/HTTP back to back for ``--seconds`` in each phase and prints the number of
pushes, p50/p99/max push latency and how many distinct ticks the threshold API showed.
Usage: ``.venv/bin/python -m bench.drain_stall [--seconds 12]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import tempfile
import time
from pathlib import Path

from ingero.otlp.health import NodePush
from tests.integration.fleet.helpers import Fleet, start_fleet
from tests.integration.slurm.cluster import missing_reason, slurm_cluster

SCORES = {"n1": 0.90, "n2": 0.91, "n3": 0.30, "n4": 0.92}


def phase(fleet: Fleet, seconds: float) -> tuple[list[float], int]:
    latencies = []
    ticks = set()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.perf_counter()
        reply = fleet.push(
            NodePush(node_id=n, cluster_id="ingerotest", score=s, job_id="41", rank=i)
            for i, (n, s) in enumerate(SCORES.items())
        )
        latencies.append((time.perf_counter() - start) * 1000)
        assert reply.status == 200, reply
        answer = fleet.threshold("ingerotest", "41")
        if answer.status == 200:
            ticks.add(answer.json()["computed_at"])
    return sorted(latencies), len(ticks)


def show(label: str, latencies: list[float], ticks: int) -> None:
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    print(
        f"{label:<20} {len(latencies):5d} pushes  p50 {statistics.median(latencies):5.2f} ms  "
        f"p99 {p99:6.2f} ms  "
        f"max {latencies[-1]:7.2f} ms  ticks seen {ticks}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=12.0, help="length of each phase")
    args = parser.parse_args()
    reason = missing_reason()
    if reason:
        raise SystemExit(f"cannot run: {reason}")
    root = Path(tempfile.mkdtemp(prefix="ingero-bench-"))
    root.chmod(0o755)  # munged runs as the munge user
    try:
        with slurm_cluster(root / "slurm", 4) as cluster:
            config = {
                "drain": {"enabled": True, "max_fraction": 0.0, "min_intervals": 1},
                "quorum": {"statistical_min": 3},
                "threshold": {"ema_alpha": 1.0, "panic_fraction": 0.3},
            }
            work = root / "fleet"
            work.mkdir()
            fleet = start_fleet(work, config, env={"SLURM_CONF": str(cluster.conf)})
            try:
                phase(fleet, 1.0)  # warm up: groups formed, the straggler known
                show("slurmctld answering", *phase(fleet, args.seconds))
                pid = cluster.procs["slurmctld"].pid
                os.kill(pid, signal.SIGSTOP)
                try:
                    show("slurmctld frozen", *phase(fleet, args.seconds))
                finally:
                    os.kill(pid, signal.SIGCONT)
                log = fleet.log()
                print(f"drain controller retries logged: {log.count('retrying in')}")
            finally:
                fleet.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
