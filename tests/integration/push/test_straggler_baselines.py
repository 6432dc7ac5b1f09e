"""A straggler stays flagged while it is slow: its samples do not become its baselines.

A real ``ingero fleet`` and sink, eight real-shaped ``ingero workload`` processes of one
Slurm job writing their rows every second, and eight real ``ingero fleet-push`` at a 1 s
push interval. The score leans on the compute signal (GPU busy against the node's own busy
baseline; throughput, against the peers' median, weighs little), and the busy baseline
learns fast when the rate falls (``ema_alpha_down`` 0.1): had the slowed node learnt from
its own samples, its slower busy fraction would be its new baseline within about 20
samples, its score back near the threshold and its episode over while it is still 15%
slower. It is flagged once, and the episode lasts, on the node and in Fleet.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration.push.cluster import Cluster, Procs, wait_for

pytestmark = pytest.mark.integration

NODES, SLOW = 8, 5
INTERVAL = 1.0
HOLD = 30  # push intervals after the flag: 30 samples at 0.1 would learn 96% of the drop
SCORE = {
    "weights": {"throughput": 0.15, "compute": 0.7, "memory": 0.15, "cpu": 0.0},
    "floor": 0.0,
    "ema_alpha_down": 0.1,
}


def test_a_straggler_stays_flagged_while_it_is_slow(tmp_path: Path, procs: Procs) -> None:
    c = Cluster(
        tmp_path,
        procs,
        INTERVAL,
        NODES,
        job_id="7",
        tracer_interval=INTERVAL,
        push_config={"score": SCORE},
        fleet_config={"metrics": {"node_series": True}},
    )
    c.start_job("--noise", "0.03")
    time.sleep(10 * INTERVAL)  # past the warm-up: every node active, its baselines learnt

    slow = c.node(SLOW)

    def episodes(kind: str) -> list[str]:
        return [e.event_id for e in c.events() if e.type == kind and e.node_id == slow]

    c.slow_down(SLOW, 0.15)
    wait_for(lambda: episodes("straggler_state"), 60 * INTERVAL, "the slower rank flagged")
    wait_for(
        lambda: c.fleet_metric("ingero_fleet_node_straggler", node_id=slow) == 1,
        10 * INTERVAL,
        "Fleet flagging the slower rank",
    )
    in_fleet = []
    for _ in range(HOLD):
        time.sleep(INTERVAL)
        in_fleet.append(c.fleet_metric("ingero_fleet_node_straggler", node_id=slow))
    # Learnt baselines would lift its score back for good; one noisy interval above
    # threshold + hysteresis does not end the episode of a node just past the threshold
    # (the exit rule wants exit_intervals of them in a row).
    assert episodes("straggler_resolved") == []
    assert len(set(episodes("straggler_state"))) == 1
    assert in_fleet == [1] * HOLD
