"""A window without data is not a stall, on real processes.

A real ``ingero fleet``, six real-shaped ``ingero workload`` processes of one Slurm job that
write their rows every second as the tracer does, but each interval's rows up to 0.4 s late
(a tracer that a loaded node delays), and six real ``ingero fleet-push`` at a 1 s push
interval, in phase with nothing: a push often finds no new row. In a steady run no node is
flagged, on the node side or by Fleet; the pushes that found nothing said so and kept their
node's state. Then one rank really stalls (its process and job file stay, the tracer's
intervals hold no launches): it is flagged with ``reason: stall``, and only it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.push.cluster import Cluster, Procs, wait_for

pytestmark = pytest.mark.integration

NODES = 6
INTERVAL = 1.0  # push interval and the workloads' write interval: equal, as in the issue
LATE = 0.4  # the most a workload writes an interval's rows after it ends
JOB = "88"
STEADY_INTERVALS = 40
DETECT_WITHIN = 40  # push intervals; generous: the machine is shared and slow


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, Procs(), INTERVAL, NODES, job_id=JOB, tracer_interval=INTERVAL)
    try:
        yield c
    finally:
        c.procs.stop_all()


def straggler_events(c: Cluster) -> list[str]:
    return [e.node_id for e in c.events() if e.type == "straggler_state"]


def test_late_rows_raise_no_false_stall_and_a_real_stall_is_flagged(cluster: Cluster) -> None:
    c = cluster
    c.start_fleet()
    c.start_sink()
    for i in range(NODES):
        c.start_workload(i, "--late", str(LATE))
        c.start_push(i)
    nodes = [c.node(i) for i in range(NODES)]
    wait_for(lambda: all("fleet" in c.modes(n) for n in nodes), 90, "every node in fleet mode")

    # Steady: every node healthy, the rows late; nothing is a straggler.
    time.sleep(STEADY_INTERVALS * INTERVAL)
    assert straggler_events(c) == []
    assert c.fleet_metric("ingero_fleet_events_total", type="straggler_state") == 0
    logs = {n: c.push_log(n) for n in nodes}
    assert not any("stalled" in log for log in logs.values()), logs
    # The late rows did leave pushes without data: they said so and kept the state.
    assert any("no data: the tracer wrote no interval" in log for log in logs.values())

    # A real stall: the process lives, its job file stays, its intervals hold no launches.
    stalled = c.node(1)
    (c.tmp / f"{stalled}.slow").write_text("stall")
    flagged = wait_for(
        lambda: straggler_events(c), DETECT_WITHIN * INTERVAL, "the stalled rank flagged"
    )
    assert set(flagged) == {stalled}
    stall = next(e for e in c.events() if e.type == "straggler_state")
    assert stall.extra["reason"] == "stall" and stall.job_id == JOB
    assert "stalled: the job runs but launches nothing" in c.push_log(stalled)
