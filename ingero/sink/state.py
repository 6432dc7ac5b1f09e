"""What the sink knows, from NDJSON lines (pure: no sockets, no HTTP)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ingero.schema.events import Event

MAX_LINE_BYTES = 64 * 1024


@dataclass
class SinkState:
    """Counts per event type, the nodes now straggling, parse errors and dropped lines."""

    events: dict[str, int] = field(default_factory=dict)
    stragglers: set[tuple[str, str]] = field(default_factory=set)  # (cluster_id, node_id)
    parse_errors: int = 0
    dropped: int = 0

    def feed(self, line: bytes) -> Event | None:
        """Apply one line; returns the event, or None when the line was not a valid event."""
        if not line.strip():
            return None
        if len(line) > MAX_LINE_BYTES:
            self.dropped += 1
            return None
        try:
            event = Event.from_dict(json.loads(line))
        except (ValueError, TypeError, UnicodeDecodeError):
            self.parse_errors += 1
            return None
        self.events[event.type] = self.events.get(event.type, 0) + 1
        key = (event.cluster_id, event.node_id)
        if event.type == "straggler_state":
            self.stragglers.add(key)
        elif event.type in ("straggler_resolved", "node_resumed"):
            self.stragglers.discard(key)
        return event
