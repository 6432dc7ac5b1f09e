"""Fleet stamps its time on every push reply it gives, from its injected clock."""

from __future__ import annotations

from ingero.fleet.config import FleetConfig
from ingero.fleet.events import EventQueue
from ingero.fleet.metrics import FleetMetrics
from ingero.fleet.receiver import Receiver
from ingero.fleet.state import FleetState
from ingero.otlp.health import NodePush, encode_health
from ingero.otlp.threshold import decode_headers, encode_headers, encode_metadata
from ingero.runtime.clock import ManualClock


def test_every_push_reply_carries_fleets_time_and_a_refused_push_none() -> None:
    clock = ManualClock(1_700_000_000.25)
    metrics = FleetMetrics(None)
    receiver = Receiver(FleetState(FleetConfig(), clock), metrics, EventQueue(metrics), clock)
    push = NodePush(node_id="n1", cluster_id="c", score=0.9, job_id="7")
    reply = receiver.metrics_request(encode_health(push, 1))
    assert reply.view is not None and reply.view.server_time == 1_700_000_000.25
    clock.advance(5.5)
    reply = receiver.metrics_request(encode_health(push, 2))
    assert reply.view is not None and reply.view.server_time == 1_700_000_005.75
    # On the wire, both transports; parsed back exactly.
    assert ("X-Ingero-Server-Time", "1700000005.75") in encode_headers(reply.view)
    assert ("ingero-server-time", "1700000005.75") in encode_metadata(reply.view)
    parsed = decode_headers(dict(encode_headers(reply.view)))
    assert parsed is not None and parsed.server_time == 1_700_000_005.75
    # Nothing accepted: no view, so no headers at all (as before).
    bad = NodePush(node_id="", cluster_id="c", score=0.9)
    assert receiver.metrics_request(encode_health(bad, 3)).view is None
