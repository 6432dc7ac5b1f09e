"""A job that replays CUDA graphs, on real processes: six scenarios as an eager job's.

A real ``ingero fleet`` and six real ``ingero workload --shape graphs`` processes (the node
DB of a job replaying CUDA graphs as torch.compile reduce-overhead does on a real H200:
~100 cudaGraphLaunch/s, each with one cudaLaunchKernel, the input copy) running Slurm job 88,
six real ``ingero fleet-push`` (half OTLP/HTTP, half gRPC) and ``ingero sink``.

In order: the healthy nodes are never flagged; a node 25% slower from its first interval is
flagged through its graph launch rate against its peers' and recovers; a 20% and a 10%
slowdown are flagged and recover; a rank that stalls is flagged with ``reason: stall``; its
job ends and the episode ends as ``job_ended``; the job ends on every node and nothing is
raised.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ingero.schema.events import Event
from tests.integration.push.cluster import Cluster, Procs, wait_for

pytestmark = pytest.mark.integration

NODES = 6
# A graph replay is coarse work (~100/s): one push a second sees ~100 of them.
INTERVAL = 1.0
JOB = "88"
# Generous bounds (in push intervals): the machine is shared with other tests and slow.
DETECT_WITHIN = 40


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, Procs(), INTERVAL, NODES, job_id=JOB, tracer_interval=0.5)
    try:
        yield c
    finally:
        c.procs.stop_all()


def of(c: Cluster, kind: str, node: str) -> list[Event]:
    return [e for e in c.events() if e.type == kind and e.node_id == node]


def api(c: Cluster, node: str) -> dict[str, Any]:
    return c.threshold(cluster_id="itest", job_id=JOB, node_id=node)


def flagged(c: Cluster, node: str, what: str) -> Event:
    first = wait_for(
        lambda: of(c, "straggler_state", node), DETECT_WITHIN * INTERVAL, f"{what} flagged"
    )[0]
    assert first.job_id == JOB and "reason" not in first.extra
    return first


def test_a_graph_replaying_job_is_judged_as_an_eager_one(cluster: Cluster) -> None:
    c = cluster
    birth, fast, slight, stalled = c.node(0), c.node(2), c.node(3), c.node(1)
    c.slow_down(0, 0.25)  # before it starts: slow from its first interval
    c.start_fleet()
    c.start_sink()
    for i in range(NODES):
        c.start_workload(i, "--shape", "graphs")
        c.start_push(i, "http" if i % 2 == 0 else "grpc")
    nodes = [c.node(i) for i in range(NODES)]
    wait_for(lambda: all("fleet" in c.modes(n) for n in nodes), 120, "every node in fleet mode")

    # The node DB holds graph replays and their input copies, nothing through the driver.
    db = c.tmp / f"{nodes[4]}.db"
    with sqlite3.connect(db) as conn:
        ops = dict(conn.execute("SELECT op, SUM(count) FROM intervals GROUP BY op").fetchall())
    assert ops.get("cudaGraphLaunch", 0) > 0 and "cuLaunchKernel" not in ops
    assert ops["cudaLaunchKernel"] == pytest.approx(ops["cudaGraphLaunch"], rel=0.2)

    # 1. Slow from birth: flagged through the graph launch rate against the peers'.
    first = flagged(c, birth, "the node slow from birth")
    mine = api(c, birth)
    assert mine["peer_rates"]["graph_launch_rate"] == pytest.approx(100.0, rel=0.15)
    assert mine["rate_ratios"]["graph_launch_rate"] == pytest.approx(0.75, abs=0.1)
    c.slow_down(0, 0.0)
    resolved = wait_for(
        lambda: of(c, "straggler_resolved", birth), 90, "the node back at its peers' rate"
    )[0]
    assert resolved.event_id == first.event_id and resolved.extra["reason"] == "recovered"

    # 2. and 3. A 20% slowdown, then (while it recovers) a 10% one on another node.
    c.slow_down(2, 0.2)
    flagged(c, fast, "the 20% slowdown")
    c.slow_down(2, 0.0)
    c.slow_down(3, 0.1)
    flagged(c, slight, "the 10% slowdown")
    c.slow_down(3, 0.0)
    for node in (fast, slight):
        ends = wait_for(lambda n=node: of(c, "straggler_resolved", n), 90, f"{node} recovered")
        assert ends[0].extra["reason"] == "recovered"

    # 4. A rank stalls; its process and job file stay: a straggler with reason stall.
    (c.tmp / f"{stalled}.slow").write_text("stall")
    stall = wait_for(
        lambda: of(c, "straggler_state", stalled), DETECT_WITHIN * INTERVAL, "the stall flagged"
    )[0]
    assert stall.extra["reason"] == "stall" and stall.job_id == JOB
    time.sleep(4 * INTERVAL)
    assert not of(c, "straggler_resolved", stalled)

    # 5. Its job ends: the process exits and its job file goes -> job_ended.
    Procs.stop(c.workloads[stalled])
    ended = wait_for(lambda: of(c, "straggler_resolved", stalled), 60, "the stall's end")[0]
    assert ended.event_id == stall.event_id and ended.extra["reason"] == "job_ended"

    # Only the nodes slowed or stalled were ever flagged (the healthy ones never).
    assert {e.node_id for e in c.events() if e.type == "straggler_state"} == {
        birth,
        fast,
        slight,
        stalled,
    }

    # 6. The job ends on every node: nobody is raised.
    before = len([e for e in c.events() if e.type.startswith("straggler")])
    for node in nodes:
        if node != stalled:
            Procs.stop(c.workloads[node])
    wait_for(lambda: c.fleet_metric("ingero_fleet_idle_nodes") == NODES, 60, "every node idle")
    time.sleep(4 * INTERVAL)
    assert len([e for e in c.events() if e.type.startswith("straggler")]) == before
