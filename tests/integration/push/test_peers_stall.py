"""Peer-relative rates, stalled ranks and one episode id, on real processes.

A real ``ingero fleet`` forwarding its events to a real ``ingero echo``, six real-shaped
``ingero workload`` processes (``gpu-bound``: driver-API launches, rare syncs, NVML rows)
that all run Slurm job 77 with their job file in the node's jobs directory, six real
``ingero fleet-push`` (half OTLP/HTTP, half gRPC) and ``ingero sink`` for their events.

In order: a node 25% slower from its first interval is flagged (its own baseline learnt
the slow rate: only the peer ratio sees it) and recovers once it runs at its peers' rate;
a rank that stalls with its job file present is flagged with ``reason: stall`` and stays
counted in its group; its job ends (the process exits and its job file goes) and the
episode ends as ``job_ended`` on both sides; the node's and Fleet's events of each episode
share one ``event_id`` in Echo; then the job ends on every node and nothing is raised.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ingero.schema.events import Event
from tests.integration.echo.helpers import EchoProcess, http
from tests.integration.push.cluster import Cluster, Procs, wait_for, with_echo

pytestmark = pytest.mark.integration

NODES = 6
INTERVAL = 0.5
JOB = "77"
# Generous bounds (in push intervals): the machine is shared with other tests and slow.
DETECT_WITHIN = 40


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Cluster, EchoProcess]]:
    c = Cluster(tmp_path, Procs(), INTERVAL, NODES, job_id=JOB)
    with with_echo(c) as echo:
        yield c, echo


def of(c: Cluster, kind: str, node: str) -> list[Event]:
    return [e for e in c.events() if e.type == kind and e.node_id == node]


def api(c: Cluster, **query: str) -> dict[str, Any]:
    return c.threshold(**query)


def stored(echo: EchoProcess, node: str) -> list[dict[str, Any]]:
    """The node's straggler events in Echo: the node's own (forwarded) and Fleet's."""
    status, body = http(
        "POST",
        echo.url + "/api/v1/sql",
        json.dumps(
            {
                "query": "SELECT type, event_id, detection_mode, extra FROM events"
                f" WHERE node_id = '{node}' AND type LIKE 'straggler_%' ORDER BY ts"
            }
        ).encode(),
    )
    assert status == 200, body
    cols = body["columns"]
    return [dict(zip(cols, row, strict=True)) for row in body["rows"]]


def test_slow_from_birth_stall_job_end_and_one_event_id(
    cluster: tuple[Cluster, EchoProcess],
) -> None:
    c, echo = cluster
    slow, stalled = c.node(0), c.node(1)
    c.slow_down(0, 0.25)  # before it starts: slow from its first interval
    c.start_fleet()
    c.start_sink()
    for i in range(NODES):
        c.start_workload(i)
        c.start_push(i, "http" if i % 2 == 0 else "grpc")
    nodes = [c.node(i) for i in range(NODES)]
    wait_for(lambda: all("fleet" in c.modes(n) for n in nodes), 90, "every node in fleet mode")

    # 1. Slow from birth: flagged through the peer ratio, and only that node.
    first = wait_for(
        lambda: of(c, "straggler_state", slow),
        DETECT_WITHIN * INTERVAL,
        "the node slow from birth flagged",
    )[0]
    assert first.detection_mode == "fleet" and "reason" not in first.extra
    mine = api(c, cluster_id="itest", job_id=JOB, node_id=slow)
    assert mine["peer_rates"]["kernel_launch_rate"] > 0
    assert mine["rate_ratios"]["kernel_launch_rate"] == pytest.approx(0.75, abs=0.1)
    # Fleet's own classification agrees (within a tick or two) and holds the same episode
    # (an id Fleet offered meanwhile gives way to the node's, which came first).
    wait_for(
        lambda: (
            api(c, cluster_id="itest", job_id=JOB, node_id=slow)["episode_id"] == first.event_id
        ),
        10 * INTERVAL,
        "Fleet holding the slow node's episode under its id",
    )
    c.slow_down(0, 0.0)
    resolved = wait_for(
        lambda: of(c, "straggler_resolved", slow), 60, "the node back at its peers' rate"
    )[0]
    assert resolved.event_id == first.event_id and resolved.extra["reason"] == "recovered"

    # 2. A rank stalls; its process and job file stay: a straggler with reason stall.
    (c.tmp / f"{stalled}.slow").write_text("stall")
    stall = wait_for(
        lambda: of(c, "straggler_state", stalled), DETECT_WITHIN * INTERVAL, "the stall flagged"
    )[0]
    assert stall.extra["reason"] == "stall" and stall.job_id == JOB
    assert (c.jobs_dir(1) / f"{JOB}.json").exists()
    # Counted in its group (an idle node would leave the statistics), not recovered by
    # going quiet: still the one straggler several intervals later.
    time.sleep(6 * INTERVAL)
    group = api(c, cluster_id="itest", job_id=JOB)
    assert group["active_nodes"] == NODES
    assert not of(c, "straggler_resolved", stalled)

    # 3. Its job ends first: the process exits and its job file goes -> job_ended.
    Procs.stop(c.workloads[stalled])
    assert not (c.jobs_dir(1) / f"{JOB}.json").exists()
    ended = wait_for(lambda: of(c, "straggler_resolved", stalled), 60, "the stall's end")[0]
    assert ended.event_id == stall.event_id and ended.extra["reason"] == "job_ended"

    # 4. Echo holds the node's and Fleet's events of each episode under one event_id
    # (Fleet's own carry extra.group; the node's come as its OTLP logs through Fleet).
    for node, episode, closing in ((slow, first, "recovered"), (stalled, stall, "job_ended")):

        def both(n: str = node) -> list[dict[str, Any]]:
            rows = stored(echo, n)
            ends = [r for r in rows if r["type"] == "straggler_resolved"]
            by_fleet = {"group" in json.loads(r["extra"]) for r in ends}
            return rows if by_fleet == {True, False} else []

        rows = wait_for(both, 60, f"Fleet's and the node's events of {node} in Echo")
        assert {r["event_id"] for r in rows} == {episode.event_id}, rows
        fleet_end = [
            json.loads(r["extra"])["reason"]
            for r in rows
            if r["type"] == "straggler_resolved" and "group" in json.loads(r["extra"])
        ]
        assert fleet_end == [closing]
    assert {e.node_id for e in c.events() if e.type == "straggler_state"} == {slow, stalled}

    # 5. The job ends on every node: nobody is raised.
    before = len([e for e in c.events() if e.type.startswith("straggler")])
    for node in nodes:
        if node != stalled:
            Procs.stop(c.workloads[node])
    wait_for(lambda: c.fleet_metric("ingero_fleet_idle_nodes") == NODES, 60, "every node idle")
    time.sleep(6 * INTERVAL)
    assert len([e for e in c.events() if e.type.startswith("straggler")]) == before
    assert c.fleet_metric("ingero_fleet_events_total", type="group_degraded") == 0
