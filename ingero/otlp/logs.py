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

from ingero.events import Event
from ingero.otlp.values import add_attributes, attributes_dict

SCOPE_NAME = "ingero"
EVENT_NAME_PREFIX = "ingero."
_WARN_TYPES = frozenset({"straggler_state", "node_drained", "group_degraded"})


@dataclass
class LogsDecode:
    events: list[Event] = field(default_factory=list)
    rejected: int = 0
    messages: list[str] = field(default_factory=list)

    def reject(self, message: str) -> None:
        self.rejected += 1
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


def decode_events(request: ExportLogsServiceRequest) -> LogsDecode:
    """Every record must be a valid ingero event; others are rejected with the reason."""
    result = LogsDecode()
    append = result.events.append
    parse = Event.from_dict
    for rl in request.resource_logs:
        for sl in rl.scope_logs:
            for record in sl.log_records:
                try:
                    append(parse(attributes_dict(record.attributes)))
                except (ValueError, TypeError) as exc:
                    result.reject(f"log record is not an ingero event: {exc}")
    return result
