"""Transport-neutral ingest: OTLP bodies in, validated pushes into FleetState, replies out.

Both the OTLP/HTTP and the gRPC receivers call this, so validation, counting and the
threshold returned to the node are the same on every transport.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import TypeVar

from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from ingero.fleet.events import EventQueue
from ingero.fleet.metrics import FleetMetrics
from ingero.fleet.model import CapacityError
from ingero.fleet.state import FleetState
from ingero.otlp.health import decode_health
from ingero.otlp.limits import TOO_LONG, ValueTooLong
from ingero.otlp.logs import decode_events
from ingero.otlp.threshold import ThresholdView
from ingero.otlp.values import OtlpDecodeError, parse_json, parse_protobuf

M = TypeVar("M", bound=Message)

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

# Rejection reasons added by the receiver (the decoders add the per-point ones).
CAPACITY = "capacity"
BAD_PUSH = "bad_push"


class RequestError(Exception):
    """A request refused as a whole: HTTP status, metric reason and a message for the client."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


@dataclass
class PushReply:
    view: ThresholdView | None = None
    accepted: int = 0
    rejected: int = 0
    messages: list[str] = field(default_factory=list)

    @property
    def error_message(self) -> str:
        return "; ".join(self.messages[:5])


def media_type(content_type: str | None) -> str:
    """``application/x-protobuf`` or ``application/json``; RequestError(415) otherwise."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media not in (PROTOBUF, JSON):
        raise RequestError(
            415, "unsupported_media_type", f"Content-Type must be {PROTOBUF} or {JSON}"
        )
    return media


def inflate(body: bytes, encoding: str | None, max_bytes: int) -> bytes:
    """The body after Content-Encoding, never more than ``max_bytes`` (zip bombs stop early)."""
    enc = (encoding or "identity").strip().lower()
    if enc == "identity":
        return body
    if enc != "gzip":
        raise RequestError(415, "unsupported_encoding", f"Content-Encoding {enc!r} is not gzip")
    inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
    try:
        out = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise RequestError(400, "malformed_gzip", f"invalid gzip body: {exc}") from None
    if len(out) > max_bytes:
        raise RequestError(
            413, "too_large", f"decompressed body exceeds limits.max_body_bytes ({max_bytes})"
        )
    if not inflater.eof:
        raise RequestError(400, "malformed_gzip", "truncated gzip body")
    return out


def parse_body(body: bytes, media: str, cls: type[M]) -> M:
    try:
        return parse_protobuf(body, cls) if media == PROTOBUF else parse_json(body, cls)
    except OtlpDecodeError as exc:
        raise RequestError(400, "malformed", str(exc)) from None


class Receiver:
    """Feeds decoded requests to the state and the event queue; counts what it refuses."""

    def __init__(self, state: FleetState, metrics: FleetMetrics, events: EventQueue) -> None:
        self._state = state
        self._metrics = metrics
        self._events = events

    def refuse(self, reason: str) -> None:
        self._metrics.count_rejected({reason: 1})

    def metrics_request(self, request: ExportMetricsServiceRequest) -> PushReply:
        decoded = decode_health(request, details=False, rates=True)
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
        return reply

    def logs_request(self, request: ExportLogsServiceRequest) -> PushReply:
        decoded = decode_events(request)
        if decoded.events:
            self._events.submit(decoded.events, source="otlp")
        if decoded.reasons:
            self._metrics.count_rejected(decoded.reasons)
        return PushReply(
            accepted=len(decoded.events), rejected=decoded.rejected, messages=decoded.messages
        )
