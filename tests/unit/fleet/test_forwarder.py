"""The Echo forwarder: never blocks, bounded, retries transient failures, drops refusals."""

from __future__ import annotations

import threading
from pathlib import Path

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from prometheus_client.parser import text_string_to_metric_families

from ingero.fleet.forwarder import Forwarder
from ingero.fleet.metrics import FleetMetrics
from ingero.fleet.spool import EventSpool
from ingero.otlp.exporter import ExportError
from ingero.otlp.logs import decode_events
from ingero.schema.events import Event


def ev(i: int) -> Event:
    return Event("straggler_state", f"n{i}", "A", 1000.0 + i, score=0.4, threshold=0.8)


class ScriptedSender:
    """Fails with the scripted errors first, then accepts; records what it accepted."""

    def __init__(
        self, failures: list[ExportError] | None = None, gate: threading.Event | None = None
    ):
        self.failures = list(failures or [])
        self.gate = gate
        self.accepted: list[str] = []
        self.attempts = 0

    def send(self, request: ExportLogsServiceRequest) -> None:
        if self.gate is not None:
            self.gate.wait()
        self.attempts += 1
        if self.failures:
            raise self.failures.pop(0)
        self.accepted.extend(e.event_id for e in decode_events(request).events)

    def close(self) -> None:
        return None


def test_transient_failures_are_retried_until_acknowledged() -> None:
    sender = ScriptedSender([ExportError("refused", True), ExportError("503", True)])
    fwd = Forwarder(sender, batch_size=10, backoff_initial=0.001, backoff_max=0.01)
    events = [ev(i) for i in range(25)]
    assert fwd.submit(events) == 25
    assert fwd.flush(10)
    fwd.close(1)
    assert sorted(sender.accepted) == sorted(e.event_id for e in events)
    assert fwd.stats.retries == 2 and fwd.stats.sent == 25 and fwd.stats.dropped_rejected == 0


def test_a_refused_batch_is_dropped_and_counted_not_retried() -> None:
    sender = ScriptedSender([ExportError("400 invalid", False)])
    fwd = Forwarder(sender, batch_size=5, backoff_initial=0.001)
    fwd.submit([ev(i) for i in range(5)])
    assert fwd.flush(10)
    fwd.submit([ev(i) for i in range(5, 8)])
    assert fwd.flush(10)
    fwd.close(1)
    assert fwd.stats.dropped_rejected == 5 and len(sender.accepted) == 3
    assert sender.attempts == 2


def test_submit_never_blocks_and_counts_what_a_full_queue_drops() -> None:
    gate = threading.Event()  # the sender is stuck: nothing leaves the queue
    sender = ScriptedSender(gate=gate)
    fwd = Forwarder(sender, capacity=10, batch_size=1)
    accepted = fwd.submit([ev(i) for i in range(30)])
    # one event may already be in flight, so 10 or 11 were taken; the rest were dropped
    assert accepted in (10, 11) and fwd.stats.dropped_full == 30 - accepted
    gate.set()
    assert fwd.flush(10)
    fwd.close(1)
    assert len(sender.accepted) == accepted


def test_close_gives_up_on_an_unreachable_echo_and_counts_the_loss() -> None:
    sender = ScriptedSender([ExportError("down", True)] * 1000)
    fwd = Forwarder(sender, batch_size=4, backoff_initial=0.01, backoff_max=0.02)
    fwd.submit([ev(i) for i in range(10)])
    fwd.close(timeout=0.2)
    assert fwd.stats.sent == 0
    assert fwd.stats.dropped_at_close == 10
    assert fwd.submit([ev(99)]) == 0  # closed: nothing more is taken


def _series(fwd: Forwarder) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The ``ingero_fleet_echo_*`` series of /metrics, read from ``fwd``."""
    metrics = FleetMetrics()
    metrics.read_echo_forwarding(fwd.figures)
    text = metrics.render().decode()
    return {
        f.name: [(s.labels, s.value) for s in f.samples]
        for f in text_string_to_metric_families(text)
        if f.name.startswith("ingero_fleet_echo")
    }


def test_metrics_show_what_waits_for_echo_and_what_was_lost() -> None:
    gate = threading.Event()  # Echo is stuck: one batch in flight, the rest queued
    sender = ScriptedSender([ExportError("400 invalid", False)], gate=gate)
    fwd = Forwarder(sender, capacity=10, batch_size=4)
    accepted = fwd.submit([ev(i) for i in range(15)])
    found = _series(fwd)
    queued = dict((s[0]["kind"], s[1]) for s in found["ingero_fleet_echo_queued"])
    assert queued == {"events": accepted, "scores": 0}  # the batch in flight counts
    dropped = {(s["kind"], s["reason"]): v for s, v in found["ingero_fleet_echo_dropped"]}
    assert dropped[("events", "full")] == 15 - accepted
    assert "ingero_fleet_echo_spool_bytes" not in found  # no spool
    gate.set()
    assert fwd.flush(10)
    fwd.close(1)
    found = _series(fwd)
    sent = dict((s[0]["kind"], s[1]) for s in found["ingero_fleet_echo_sent"])
    dropped = {(s["kind"], s["reason"]): v for s, v in found["ingero_fleet_echo_dropped"]}
    # the first batch of 4 was refused, the rest acknowledged
    assert sent == {"events": accepted - 4, "scores": 0}
    assert dropped[("events", "rejected")] == 4
    assert dict((s[0]["kind"], s[1]) for s in found["ingero_fleet_echo_queued"])["events"] == 0


def test_metrics_show_the_spool_filling_while_echo_is_down(tmp_path: Path) -> None:
    sender = ScriptedSender([ExportError("down", True)] * 1000)
    spool = EventSpool(tmp_path, max_events=100, max_bytes=1 << 20)
    fwd = Forwarder(sender, batch_size=4, backoff_initial=0.01, backoff_max=0.02, spool=spool)
    try:
        assert fwd.submit([ev(i) for i in range(10)]) == 10
        found = _series(fwd)
        queued = dict((s[0]["kind"], s[1]) for s in found["ingero_fleet_echo_queued"])
        assert queued["events"] == 10  # the spool counts its batch in flight itself
        ((_, size),) = found["ingero_fleet_echo_spool_bytes"]
        assert size == spool.size_bytes() > 0
        for _ in range(1000):  # Echo down: the sender retries (back-off 10-20 ms)
            if _series(fwd)["ingero_fleet_echo_retries"][0][1]:
                break
            threading.Event().wait(0.01)
        else:
            raise AssertionError("no retry counted")
    finally:
        fwd.close(timeout=0.1)
