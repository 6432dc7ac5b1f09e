"""The Echo forwarder's score samples: OTLP metrics batches with the events' guarantees."""

from __future__ import annotations

import threading

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from ingero.fleet.forwarder import Forwarder
from ingero.fleet.score_history import ScoreSample
from ingero.fleet.state import NodeScore
from ingero.otlp.exporter import ExportError, HttpExporter
from ingero.otlp.health import decode_health
from ingero.otlp.logs import decode_events
from ingero.schema.events import Event


def sample(i: int) -> ScoreSample:
    node = NodeScore(
        f"n{i}", "A", "A/job/7", "7", None, i, 0.5, "active", None, 0.0, None, None, None, None
    )
    return ScoreSample(node, 1_700_000_000_000_000_000 + i)


class RecordingSender:
    """Fails with the scripted errors first, then accepts; records every accepted request."""

    def __init__(
        self, failures: list[ExportError] | None = None, gate: threading.Event | None = None
    ) -> None:
        self.failures = list(failures or [])
        self.gate = gate
        self.accepted: list[tuple[str, list[str]]] = []  # (kind, node ids) per request
        self.entered = threading.Event()  # a request is in flight

    def send(self, request: ExportLogsServiceRequest | ExportMetricsServiceRequest) -> None:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait()
        if self.failures:
            raise self.failures.pop(0)
        if isinstance(request, ExportMetricsServiceRequest):
            self.accepted.append(("scores", [p.node_id for p in decode_health(request).pushes]))
        else:
            self.accepted.append(("events", [e.node_id for e in decode_events(request).events]))

    def close(self) -> None:
        return None


def test_samples_go_as_metrics_batches_of_many_nodes() -> None:
    sender = RecordingSender()
    fwd = Forwarder(sender, batch_size=4)
    assert fwd.submit_scores([sample(i) for i in range(10)]) == 10
    assert fwd.flush(10)
    fwd.close(1)
    assert [kind for kind, _ in sender.accepted] == ["scores"] * 3
    assert [len(ids) for _, ids in sender.accepted] == [4, 4, 2]
    assert [n for _, ids in sender.accepted for n in ids] == [f"n{i}" for i in range(10)]
    assert fwd.stats.scores_sent == 10 and fwd.stats.scores_queued == 10
    assert fwd.stats.sent == 0  # the event counters are the events' own


def test_waiting_events_go_before_waiting_samples() -> None:
    gate = threading.Event()
    sender = RecordingSender(gate=gate)
    fwd = Forwarder(sender, batch_size=100)
    fwd.submit_scores([sample(0)])
    assert sender.entered.wait(10)  # in flight, held by the gate
    fwd.submit_scores([sample(1)])
    fwd.submit([Event("straggler_state", "e1", "A", 1.0, score=0.4, threshold=0.8)])
    gate.set()
    assert fwd.flush(10)
    fwd.close(1)
    assert [kind for kind, _ in sender.accepted][1:] == ["events", "scores"]


def test_transient_failures_are_retried_and_a_refusal_is_dropped_and_counted() -> None:
    sender = RecordingSender(
        [ExportError("503", True), ExportError("unavailable", True), ExportError("400", False)]
    )
    fwd = Forwarder(sender, batch_size=5, backoff_initial=0.001, backoff_max=0.01)
    fwd.submit_scores([sample(i) for i in range(5)])
    assert fwd.flush(10)  # two retries, then refused: dropped, never retried
    fwd.submit_scores([sample(i) for i in range(5, 8)])
    assert fwd.flush(10)
    fwd.close(1)
    assert fwd.stats.retries == 2
    assert fwd.stats.scores_dropped_rejected == 5 and fwd.stats.dropped_rejected == 0
    assert sender.accepted == [("scores", ["n5", "n6", "n7"])]


def test_a_full_sample_queue_drops_and_counts_without_blocking_or_touching_events() -> None:
    gate = threading.Event()
    sender = RecordingSender(gate=gate)
    fwd = Forwarder(sender, capacity=10, score_capacity=5, batch_size=1)
    accepted = fwd.submit_scores([sample(i) for i in range(20)])
    assert accepted in (5, 6)  # one may already be in flight
    assert fwd.stats.scores_dropped_full == 20 - accepted and fwd.stats.dropped_full == 0
    events = [Event("straggler_state", f"e{i}", "A", 1.0, score=0.4) for i in range(3)]
    assert fwd.submit(events) == 3  # events have their own room
    gate.set()
    assert fwd.flush(10)
    fwd.close(1)
    assert fwd.stats.scores_sent == accepted and fwd.stats.sent == 3


def test_close_counts_the_samples_it_could_not_deliver() -> None:
    sender = RecordingSender([ExportError("down", True)] * 1000)
    fwd = Forwarder(sender, batch_size=4, backoff_initial=0.01, backoff_max=0.02)
    fwd.submit_scores([sample(i) for i in range(10)])
    fwd.close(timeout=0.2)
    assert fwd.stats.scores_sent == 0 and fwd.stats.scores_dropped_at_close == 10
    assert fwd.submit_scores([sample(99)]) == 0


def test_http_sender_posts_samples_to_v1_metrics() -> None:
    sender = HttpExporter("http://echo.example:4328/otlp/", None, 10.0)
    assert (sender.paths["logs"], sender.paths["metrics"]) == ("/otlp/v1/logs", "/otlp/v1/metrics")
