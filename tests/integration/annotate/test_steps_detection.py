"""Steps the job marks are the step rate detection compares: on real processes.

Four simulated nodes of one job: each a real ``ingero workload`` (the tracer's rows, the same
kernel launch rate everywhere), a real ``ingero annotate serve`` on the same node DB, a real
job process marking its steps through the client, and a real ``ingero fleet-push``, with
``ingero fleet`` and ``ingero sink``. One job marks half the steps of its peers while it
launches as many kernels: only its own step marks show it, and it is flagged on its step
rate against theirs; the others never are.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.push.cluster import Cluster, Procs, ingero, wait_for

pytestmark = pytest.mark.integration

NODES = 4
INTERVAL = 1.0
JOB = "91"
# A job process marking steps at a steady rate until stopped (pacing, not a measurement).
JOB_LOOP = """
import sys, time
from ingero.annotate.client import Annotator
a, rate, i = Annotator(sys.argv[1]), float(sys.argv[2]), 0
while True:
    i += 1
    a.step(i)
    time.sleep(1 / rate)
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, Procs(), INTERVAL, NODES, job_id=JOB, tracer_interval=0.5)
    c.fleet_config = {"quorum": {"statistical_min": 3}}  # four nodes: peers for each
    try:
        yield c
    finally:
        c.procs.stop_all()


def test_marked_steps_flag_the_node_whose_job_steps_slower(cluster: Cluster) -> None:
    c = cluster
    c.start_fleet()
    c.start_sink()
    for i in range(NODES):
        node = c.node(i)
        sock = c.tmp / f"{node}.annotate.sock"
        log = c.tmp / f"{node}.annotate.log"
        c.start_workload(i)
        c.procs.start(
            ingero("annotate", "serve", "--socket", str(sock), "--db", str(c.tmp / f"{node}.db"),
                   "--flush", "0.5"),
            log,
        )  # fmt: skip
        wait_for(lambda log=log: "listening on" in log.read_text(), 60, f"{node} annotate")
        rate = "5" if i == 0 else "10"
        # The job's process, as Slurm starts it: its marks are the pushed job's steps
        # (the server's own user, so its environment names its job).
        c.procs.start([ingero()[0], "-c", JOB_LOOP, str(sock), rate],
                      c.tmp / f"{node}.job.log", env={"SLURM_JOB_ID": JOB})  # fmt: skip
        c.start_push(i)
    nodes = [c.node(i) for i in range(NODES)]
    wait_for(lambda: all("fleet" in c.modes(n) for n in nodes), 120, "every node in fleet mode")

    slow = nodes[0]
    first = wait_for(
        lambda: [e for e in c.events() if e.type == "straggler_state" and e.node_id == slow],
        60,
        "the node whose job steps at half its peers' rate flagged",
    )[0]
    assert first.job_id == JOB
    mine = c.threshold(cluster_id="itest", job_id=JOB, node_id=slow)
    assert mine["peer_rates"]["step_rate"] > 0
    # One push's window holds a second or two of marks written at 5/s against 10/s, so
    # the ratio of the push read here is 0.5 give or take a few marks (0.75 was seen under
    # load): below its peers', which is what flagged it.
    assert 0 < mine["rate_ratios"]["step_rate"] < 0.85
    # Its kernel launches are its peers': only the job's own marks tell it apart.
    assert mine["rate_ratios"]["kernel_launch_rate"] == pytest.approx(1.0, abs=0.15)
    assert {e.node_id for e in c.events() if e.type == "straggler_state"} == {slow}
