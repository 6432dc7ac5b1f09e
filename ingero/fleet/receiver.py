"""Transport-neutral ingest: decoded OTLP requests in, validated pushes into FleetState,
replies out.

Both the OTLP/HTTP and the gRPC receivers call this, so validation, counting and the
threshold returned to the node are the same on every transport; what a request may be on
the wire (media types, gzip, limits, the answers) is the OTLP receiver core's
(``ingero.otlp.receiver``), which Echo's receivers share.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from ingero.fleet.events import EventQueue
from ingero.fleet.metrics import FleetMetrics
from ingero.fleet.model import CapacityError
from ingero.fleet.scope import check_scope
from ingero.fleet.state import FleetState
from ingero.otlp.health import decode_health
from ingero.otlp.limits import TOO_LONG, ValueTooLong
from ingero.otlp.logs import decode_events
from ingero.otlp.receiver import export_response
from ingero.otlp.threshold import ThresholdView, with_fields
from ingero.otlp.transport import Signal
from ingero.runtime.clock import Clock, SystemClock
from ingero.security.bearer import Identity
from ingero.security.scope import ClusterScope

# Rejection reasons added by the receiver (the decoders add the per-point ones, the OTLP
# receiver core those of requests refused as a whole).
CAPACITY = "capacity"
BAD_PUSH = "bad_push"


@dataclass
class PushReply:
    view: ThresholdView | None = None
    accepted: int = 0
    rejected: int = 0
    messages: list[str] = field(default_factory=list)

    @property
    def error_message(self) -> str:
        return "; ".join(self.messages[:5])


class Receiver:
    """Feeds decoded requests to the state and the event queue; counts what it refuses."""

    def __init__(
        self,
        state: FleetState,
        metrics: FleetMetrics,
        events: EventQueue,
        clock: Clock | None = None,
    ) -> None:
        self._state = state
        self._metrics = metrics
        self._events = events
        self._clock = clock or SystemClock()

    def refuse(self, reason: str) -> None:
        self._metrics.count_rejected({reason: 1})

    def metrics_request(
        self, request: ExportMetricsServiceRequest, identity: Identity[ClusterScope] | None = None
    ) -> PushReply:
        decoded = decode_health(request, details=False, rates=True)
        # Before anything is ingested or counted: a refused request leaves no trace but its
        # refusal (RequestError, 403).
        check_scope(identity, (push.cluster_id for push in decoded.pushes))
        reply = PushReply(rejected=decoded.rejected, messages=decoded.messages)
        reasons = dict(decoded.reasons)
        for push in decoded.pushes:
            try:
                reply.view = self._state.ingest(push)
            except CapacityError as exc:
                reason, message = CAPACITY, str(exc)
            except ValueTooLong as exc:
                reason, message = TOO_LONG, str(exc)
            except ValueError as exc:
                reason, message = BAD_PUSH, str(exc)
            else:
                reply.accepted += 1
                continue
            reply.rejected += 1
            reasons[reason] = reasons.get(reason, 0) + 1
            reply.messages.append(message)
        if reasons:
            self._metrics.count_rejected(reasons)
        if reply.view is not None:
            # Fleet's time as it answers, the last thing before the reply is written: the
            # node estimates its clock offset from it (ingero.push.clock_offset). Once per
            # request, not per push: a request carries one node's push.
            reply.view = with_fields(reply.view, server_time=self._clock.now())
        return reply

    def logs_request(
        self, request: ExportLogsServiceRequest, identity: Identity[ClusterScope] | None = None
    ) -> PushReply:
        decoded = decode_events(request)
        check_scope(identity, (event.cluster_id for event in decoded.events))
        if decoded.events:
            self._events.submit(decoded.events, source="otlp")
        if decoded.reasons:
            self._metrics.count_rejected(decoded.reasons)
        return PushReply(
            accepted=len(decoded.events), rejected=decoded.rejected, messages=decoded.messages
        )

    def request(
        self, signal: Signal, message: Message, identity: Identity[ClusterScope] | None = None
    ) -> PushReply:
        """A decoded Export request of ``signal`` from ``identity`` (None: authentication
        off), ingested; a RequestError (403) when it holds a cluster outside the token's
        scope, then nothing of it is."""
        if signal == "metrics":
            assert isinstance(message, ExportMetricsServiceRequest)
            return self.metrics_request(message, identity)
        assert isinstance(message, ExportLogsServiceRequest)
        return self.logs_request(message, identity)

    @staticmethod
    def response(signal: Signal, reply: PushReply) -> Message:
        """The Export response of ``reply``: a partial success when some were rejected."""
        return export_response(signal, reply.rejected, reply.error_message)
