"""ingero events as OTLP log records, and the validating decoder.

Each record carries the event's ``to_dict()`` fields as attributes (``event_id`` among them,
so the same id travels on every channel), ``message()`` as body, the event time, and
``event_name`` ``ingero.<type>``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.logs.v1.logs_pb2 import (
    SEVERITY_NUMBER_INFO,
    SEVERITY_NUMBER_WARN,
)

from ingero.otlp.limits import (
    MAX_EVENT_BYTES,
    MAX_ID_CHARS,
    TOO_LONG,
    ValueTooLong,
    check_lengths,
)
from ingero.otlp.values import add_attributes, attributes_dict
from ingero.schema.events import Event

SCOPE_NAME = "ingero"
EVENT_NAME_PREFIX = "ingero."
_WARN_TYPES = frozenset({"straggler_state", "node_drained", "group_degraded"})
# Rejection reason of a record that is not a valid ingero event (TOO_LONG: over a limit).
BAD_EVENT = "bad_event"


@dataclass
class LogsDecode:
    events: list[Event] = field(default_factory=list)
    rejected: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)

    def reject(self, reason: str, message: str) -> None:
        self.rejected += 1
        self.reasons[reason] = self.reasons.get(reason, 0) + 1
        if len(self.messages) < 5:
            self.messages.append(message)

    @property
    def error_message(self) -> str:
        return "; ".join(self.messages)


def encode_events(
    events: Iterable[Event], resource: Mapping[str, object] | None = None
) -> ExportLogsServiceRequest:
    """One request with one log record per event, under one resource (e.g. the sender)."""
    request = ExportLogsServiceRequest()
    rl = request.resource_logs.add()
    add_attributes(rl.resource.attributes, dict(resource or {}))
    sl = rl.scope_logs.add()
    sl.scope.name = SCOPE_NAME
    for event in events:
        record = sl.log_records.add()
        record.time_unix_nano = int(event.timestamp * 1e9)
        record.event_name = EVENT_NAME_PREFIX + event.type
        warn = event.type in _WARN_TYPES
        record.severity_number = SEVERITY_NUMBER_WARN if warn else SEVERITY_NUMBER_INFO
        record.severity_text = "WARN" if warn else "INFO"
        record.body.string_value = event.message()
        add_attributes(record.attributes, event.to_dict())
    return request


def _within_limits(event: Event) -> Event:
    """``event`` when its ids, names and extra fields' names are within MAX_ID_CHARS; else
    ValueTooLong. (Its type and event id are within by validation: a known type, a UUID.)"""
    if event.extra:
        longest = max(map(len, event.extra))
        if longest > MAX_ID_CHARS:
            raise ValueTooLong(
                f"an extra field's name is {longest} characters long, the limit is {MAX_ID_CHARS}"
            )
    check_lengths(
        (
            ("node_id", event.node_id),
            ("cluster_id", event.cluster_id),
            ("job_id", event.job_id),
            ("detection_mode", event.detection_mode),
            ("dominant_signal", event.dominant_signal),
        )
    )
    return event


def decode_events(request: ExportLogsServiceRequest) -> LogsDecode:
    """Every record must be a valid ingero event within the size limits of
    ``ingero.otlp.limits``; others are rejected with the reason (``bad_event``, ``too_long``)."""
    result = LogsDecode()
    append = result.events.append
    parse = Event.from_dict
    for rl in request.resource_logs:
        for sl in rl.scope_logs:
            for record in sl.log_records:
                # The whole record first: what a receiver may keep of one event is bounded
                # (Fleet queues events until its next tick; Echo stores them), and nothing
                # below works on a huge value.
                size = record.ByteSize()
                if size > MAX_EVENT_BYTES:
                    result.reject(
                        TOO_LONG,
                        f"log record of {size} bytes, the limit is {MAX_EVENT_BYTES}",
                    )
                    continue
                try:
                    append(_within_limits(parse(attributes_dict(record.attributes))))
                except ValueTooLong as exc:
                    result.reject(TOO_LONG, f"log record: {exc}")
                except (ValueError, TypeError) as exc:
                    result.reject(BAD_EVENT, f"log record is not an ingero event: {exc}")
    return result
