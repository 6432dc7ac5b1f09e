"""Fleet's event exit point: every sink gets every event; a failing sink harms no other."""

from __future__ import annotations

from collections.abc import Sequence

from ingero.events import Event
from ingero.fleet.events import EventQueue
from ingero.fleet.metrics import FleetMetrics


def event(node: str) -> Event:
    return Event(type="straggler_state", node_id=node, cluster_id="c", timestamp=1.0)


def test_delivery_to_every_sink_despite_a_failing_one() -> None:
    metrics = FleetMetrics()
    queue = EventQueue(metrics)
    got: list[str] = []

    def broken(_events: Sequence[Event]) -> None:
        raise OSError("echo unreachable")

    queue.add_sink(broken)
    queue.add_sink(lambda events: got.extend(e.node_id for e in events), "collect")
    queue.submit([event("a"), event("b")], source="tick")
    queue.submit([event("c")], source="otlp")
    assert queue.deliver() == 3
    assert got == ["a", "b", "c"]
    assert queue.deliver() == 0  # delivered once
    text = metrics.render().decode()
    assert 'ingero_fleet_tick_listener_errors_total{listener="broken"} 1.0' in text
    assert 'ingero_fleet_events_total{source="tick",type="straggler_state"} 2.0' in text


def test_full_queue_drops_and_counts() -> None:
    metrics = FleetMetrics()
    queue = EventQueue(metrics, capacity=2)
    queue.submit([event("a"), event("b"), event("c")], source="otlp")
    assert queue.deliver() == 2
    assert "ingero_fleet_events_dropped_total 1.0" in metrics.render().decode()
