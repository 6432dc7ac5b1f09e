"""A real fleet and six real fleet-push processes fed by the synthetic workload.

Half the nodes push over OTLP/HTTP, half over OTLP gRPC (threshold from headers/metadata).

One scenario, in order: warm-up to ``fleet`` mode; a 30% slowdown on one node is reported
as a straggler within a bounded number of push intervals and on no other node; Fleet is
killed and every node steps down to fleet-cached, then local modes, without crashing; Fleet
comes back and ``fleet`` mode returns; the slow node recovers (one ``straggler_resolved``
under its episode's ``event_id``); a restarted fleet-push skips warm-up.
"""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingero.schema.events import Event
from tests.integration.push.cluster import Cluster, Procs, wait_for

pytestmark = pytest.mark.integration

NODES = 6
INTERVAL = 0.5
# Generous bound on detection (in push intervals): the machine is shared and slow.
DETECT_WITHIN = 40


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    procs = Procs()
    c = Cluster(tmp_path, procs, INTERVAL, NODES)
    try:
        yield c
    finally:
        procs.stop_all()


def test_straggler_failover_and_restart(cluster: Cluster) -> None:
    c = cluster
    c.start_fleet()
    c.start_sink()
    for i in range(NODES):
        c.start_workload(i)
        c.start_push(i, "http" if i < NODES // 2 else "grpc")
    nodes = [c.node(i) for i in range(NODES)]

    wait_for(lambda: all("fleet" in c.modes(n) for n in nodes), 90, "every node in fleet mode")
    assert not [e for e in c.events() if e.type == "straggler_state"], "no straggler yet"

    c.slow_down(0, 0.3)
    straggler = wait_for(
        lambda: [e for e in c.events() if e.type == "straggler_state"],
        DETECT_WITHIN * INTERVAL,
        f"a straggler event within {DETECT_WITHIN} push intervals",
    )
    assert {e.node_id for e in straggler} == {nodes[0]}
    first = straggler[0]
    assert first.detection_mode == "fleet"
    assert first.score is not None and first.threshold is not None
    assert first.score < first.threshold
    assert first.extra.get("panic") is False
    # Both transports carried pushes; the agents' events reached Fleet as OTLP logs.
    for transport in ("http", "grpc"):
        assert c.fleet_metric("ingero_fleet_requests_total", transport=transport, signal="metrics")
        assert c.fleet_metric("ingero_fleet_requests_total", transport=transport, signal="logs")
    wait_for(
        lambda: c.fleet_metric("ingero_fleet_events_total", type="straggler_state", source="otlp"),
        30,
        "the straggler event at Fleet as an OTLP log",
    )

    # Fleet goes away: modes step down, nobody crashes.
    assert c.fleet is not None
    Procs.stop(c.fleet, signal.SIGKILL)
    for mode in ("fleet-cached", "local-cached"):
        wait_for(lambda m=mode: all(m in c.modes(n) for n in nodes), 60, f"all nodes in {mode}")
    wait_for(
        lambda: all(c.modes(n)[-1] == "local-baseline" for n in nodes[1:]),
        60,
        "healthy nodes on their local baseline",
    )
    assert all(p.poll() is None for p in c.pushers.values()), "a fleet-push exited"

    # Fleet is back on the same ports: fleet mode returns everywhere.
    counts = {n: c.modes(n).count("fleet") for n in nodes}
    c.start_fleet()
    wait_for(
        lambda: all(c.modes(n).count("fleet") > counts[n] for n in nodes),
        120,
        "fleet mode back on every node",
    )
    others = {e.node_id for e in c.events() if e.type == "straggler_state"}
    assert others <= {nodes[0]}, f"false straggler events on {others - {nodes[0]}}"

    # The slow node recovers: its episode ends once, under the episode's event id.
    c.slow_down(0, 0.0)

    # (An earlier episode may already have ended while Fleet was away; wait for the last one.)
    def of_node(kind: str) -> list[Event]:
        return [e for e in c.events() if e.type == kind and e.node_id == nodes[0]]

    last = wait_for(
        lambda: [
            e
            for e in of_node("straggler_resolved")
            if e.event_id == of_node("straggler_state")[-1].event_id
        ],
        60,
        "the straggler's last episode to end",
    )
    assert len(last) == 1 and last[0].extra.get("reason") == "recovered"
    ends = Counter(e.event_id for e in of_node("straggler_resolved"))
    assert all(n == 1 for n in ends.values()), f"an episode ended more than once: {ends}"
    assert set(ends) <= {e.event_id for e in of_node("straggler_state")}

    # A restarted fleet-push restores its baselines and skips warm-up.
    restarted = nodes[1]
    assert Procs.stop(c.pushers[restarted]) == 0
    before, seen = c.push_log(restarted), len(c.modes(restarted))
    c.start_push(1)
    wait_for(lambda: "fleet" in c.modes(restarted)[seen:], 60, "the restarted node in fleet mode")
    after = c.push_log(restarted)[len(before) :]
    assert "baselines restored" in after
    assert "calibrating" not in after
    assert c.pushers[restarted].poll() is None
