"""A tracer slower than the pushes: one measurement is one interval, on Fleet's side too.

A real ``ingero fleet`` and sink, six real-shaped ``ingero workload`` processes of one Slurm
job that write their node DB every 2 s as the tracer does, and six real ``ingero
fleet-push`` at a 1 s push interval with the default enter rule (3 of the last 5): every
other push finds no new tracer interval and holds (pushes the node's last measurement
again). A healthy node's dip of exactly two tracer intervals is two measurements below, not
an episode: neither the node nor Fleet flags it, nor is it ever a straggler in Fleet's
per-node series (Fleet used to count each held repeat as one more interval below: four of
five, or three when two pushes fell into one tick). A rank then 10% slower is still
flagged, by the node and by Fleet.
"""

from __future__ import annotations

import sqlite3
import statistics
import threading
import time
from pathlib import Path

import pytest

from tests.integration.push.cluster import Cluster, Procs, wait_for

pytestmark = pytest.mark.integration

NODES, DIP, SLOW = 6, 2, 4  # six ranks of one job; rank 2 dips, rank 4 slows down
PUSH, TRACER = 1.0, 2.0  # the tracer writes half as often as the node pushes
DIP_INTERVALS = 2  # tracer intervals of the dip: one short of the enter rule's 3
STEADY, AFTER_DIP, DETECT_WITHIN = 20.0, 15.0, 90.0  # seconds; generous: the host is shared


def launch_rates(db: Path) -> list[float]:
    """Each tracer interval's kernel launches per second, as the workload wrote them."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute(
            "SELECT h.ts_end - h.ts_start, COALESCE(SUM(i.count), 0) FROM host_intervals h"
            " LEFT JOIN intervals i ON i.ts_end = h.ts_end AND i.op = 'cuLaunchKernel'"
            " GROUP BY h.ts_end ORDER BY h.ts_end"
        ).fetchall()
    return [launches / length for length, launches in rows if length > 0]


def slowed(db: Path) -> list[bool]:
    """Which of the node's tracer intervals the workload slowed (1% noise: a 30% dip is
    unmistakable against the median, which the healthy intervals make)."""
    rates = launch_rates(db)
    typical = statistics.median(rates) if rates else 0.0
    return [rate < 0.85 * typical for rate in rates]


def dip(c: Cluster, i: int, slowdown: float, intervals: int) -> None:
    """Slow node ``i``'s work for exactly ``intervals`` tracer intervals: its workload
    counts them itself (however late this test comes to look), and the node DB shows it:
    that many slowed intervals in a row, then one at full speed again."""
    db = c.tmp / f"{c.node(i)}.db"
    assert not any(slowed(db))
    c.slow_down(i, slowdown, intervals)
    flags = wait_for(
        lambda: (f := slowed(db)) and sum(f) >= intervals and not f[-1] and f,
        60,
        f"{intervals} slowed intervals, then one at full speed",
    )
    first = flags.index(True)
    assert flags[first : first + intervals] == [True] * intervals and sum(flags) == intervals


def test_a_held_push_does_not_count_twice_and_a_real_straggler_is_flagged(
    tmp_path: Path, procs: Procs
) -> None:
    c = Cluster(
        tmp_path,
        procs,
        PUSH,
        NODES,
        job_id="25",
        tracer_interval=TRACER,
        fleet_config={"metrics": {"node_series": True}},
    )
    nodes = c.start_job("--noise", "0.01")

    def flagged() -> list[str]:
        return [e.node_id for e in c.events() if e.type == "straggler_state"]

    def fleet_flagged() -> float:
        return c.fleet_metric("ingero_fleet_events_total", type="straggler_state")

    time.sleep(STEADY)
    assert flagged() == [] and fleet_flagged() == 0
    # Half the pushes found no new tracer interval and held.
    assert all("no data: the tracer wrote no interval" in c.push_log(n) for n in nodes)

    # A healthy node's transient dip: two measurements 30% down, each pushed twice. Fleet
    # announces an episode only after one more push of the node, so one that ends at once
    # raises no event: its per-node series is watched too, at a tenth of a tick.
    seen: set[float] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.1):
            seen.add(c.fleet_metric("ingero_fleet_node_straggler", node_id=c.node(DIP)))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        dip(c, DIP, 0.3, DIP_INTERVALS)
        time.sleep(AFTER_DIP)
    finally:
        done.set()
        watcher.join()
    assert flagged() == [], flagged()
    assert fleet_flagged() == 0
    assert seen == {0.0}

    # A real straggler: still flagged, by the node and by Fleet, and only it.
    slow = c.node(SLOW)
    c.slow_down(SLOW, 0.1)
    wait_for(lambda: slow in flagged(), DETECT_WITHIN, "the 10% slower rank flagged")
    wait_for(lambda: fleet_flagged() >= 1, DETECT_WITHIN, "Fleet flagging the slow rank")
    assert set(flagged()) == {slow}, flagged()
