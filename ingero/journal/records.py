"""Parse ``journalctl -o json`` lines back into ingero events.

A journal record is what ``Event.journal_fields()`` wrote plus journald's own trusted fields.
journalctl renders a field as a string, as a list of byte values when it is not valid text,
and as a list of those when the field was written more than once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ingero.schema.events import EVENT_TYPES, Event

# journald field -> event field, the inverse of Event.journal_fields()
_NAMED = {"INGERO_NODE": "node_id", "INGERO_CLUSTER": "cluster_id", "INGERO_JOB": "job_id"}
_FLOATS = ("timestamp", "score", "threshold")
_BOOLS = {"true": True, "false": False, "True": True, "False": False}
# schema fields that are text whatever they look like (a node may be called "true")
_TEXT = frozenset(
    {"node_id", "cluster_id", "job_id", "event_id", "detection_mode", "dominant_signal"}
)


@dataclass(frozen=True)
class JournalEvent:
    """An event as the journal holds it, with where it was logged."""

    event: Event
    unit: str | None
    hostname: str | None
    cursor: str | None


class RecordError(ValueError):
    """One journal line that is not a readable ingero event."""


def field_text(value: Any) -> str:
    """A journalctl JSON field value as text (the last value of a repeated field)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(b, int) for b in value):
        try:
            return bytes(value).decode("utf-8", errors="replace")
        except ValueError:
            raise RecordError("a binary field holds values outside 0..255") from None
    if isinstance(value, list) and value:
        return field_text(value[-1])
    raise RecordError(f"unexpected journal field value {value!r:.60}")


def _typed(name: str, text: str) -> Any:
    """Undo the str()/json.dumps() of journal_fields for the fields whose type matters."""
    if name in _FLOATS:
        try:
            return float(text)
        except ValueError:
            raise RecordError(f"field {name} is not a number: {text!r:.40}") from None
    if name == "rank":
        try:
            return int(text)
        except ValueError:
            raise RecordError(f"field rank is not an integer: {text!r:.40}") from None
    if name in _TEXT:
        return text
    if text in _BOOLS:
        return _BOOLS[text]
    if text[:1] in "[{":
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


def parse_record(record: dict[str, Any]) -> JournalEvent | None:
    """The ingero event in one journal record; None for records that are not ingero events."""
    if "INGERO_EVENT" not in record:
        return None
    kind = field_text(record["INGERO_EVENT"])
    if kind not in EVENT_TYPES:
        raise RecordError(f"unknown event type {kind!r:.40}")
    data: dict[str, Any] = {"type": kind}
    for key, value in record.items():
        if not key.startswith("INGERO_") or key == "INGERO_EVENT":
            continue
        name = _NAMED.get(key, key[len("INGERO_") :].lower())
        data[name] = _typed(name, field_text(value))
    if "timestamp" not in data and "__REALTIME_TIMESTAMP" in record:
        # journald's receive time (microseconds) when the writer gave none
        data["timestamp"] = int(field_text(record["__REALTIME_TIMESTAMP"])) / 1e6
    data.setdefault("node_id", "")
    data.setdefault("cluster_id", "")
    try:
        event = Event.from_dict(data)
    except ValueError as exc:
        raise RecordError(str(exc)) from None
    unit = record.get("_SYSTEMD_UNIT")
    host = record.get("_HOSTNAME")
    cursor = record.get("__CURSOR")
    return JournalEvent(
        event=event,
        unit=field_text(unit) if unit is not None else None,
        hostname=field_text(host) if host is not None else None,
        cursor=field_text(cursor) if cursor is not None else None,
    )


def parse_line(line: str) -> JournalEvent | None:
    """Parse one line of ``journalctl -o json``; raises RecordError on a malformed line."""
    try:
        record = json.loads(line)
    except ValueError:
        raise RecordError(f"not JSON: {line.strip()!r:.60}") from None
    if not isinstance(record, dict):
        raise RecordError("a journal record must be a JSON object")
    return parse_record(record)
