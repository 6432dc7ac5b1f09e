"""The one exit point of Fleet's events: a bounded queue the tick thread drains to sinks.

Receivers and the tick submit (cheap, never blocks the hot path); the tick thread
delivers to every sink (journald via logging, Echo forwarding, ...). A sink that raises is
logged and counted and the others still get the events.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from ingero.events import Event
from ingero.fleet.metrics import FleetMetrics

log = logging.getLogger(__name__)

EventSink = Callable[[Sequence[Event]], None]
DEFAULT_CAPACITY = 100_000


def log_sink(events: Sequence[Event]) -> None:
    """Every event as one stderr line (journald keeps it when Fleet runs under systemd)."""
    for event in events:
        level = (
            logging.WARNING if event.type in ("straggler_state", "group_degraded") else logging.INFO
        )
        log.log(level, "%s event_id=%s", event.message(), event.event_id)


class EventQueue:
    def __init__(self, metrics: FleetMetrics, capacity: int = DEFAULT_CAPACITY) -> None:
        self._metrics = metrics
        self._queue: deque[tuple[Event, str]] = deque()
        self._capacity = capacity
        self._lock = threading.Lock()
        self._sinks: list[tuple[str, EventSink]] = []

    def add_sink(self, sink: EventSink, name: str | None = None) -> None:
        self._sinks.append((name or str(getattr(sink, "__name__", sink)), sink))

    def submit(self, events: Iterable[Event], source: str) -> None:
        with self._lock:
            for event in events:
                if len(self._queue) >= self._capacity:
                    self._metrics.events_dropped.inc()
                    continue
                self._queue.append((event, source))

    def deliver(self) -> int:
        """Hand every queued event to every sink (tick thread only); returns how many."""
        with self._lock:
            batch = list(self._queue)
            self._queue.clear()
        if not batch:
            return 0
        events = [event for event, _ in batch]
        for event, source in batch:
            self._metrics.events.labels(event.type, source).inc()
        for name, sink in self._sinks:
            try:
                sink(events)
            except Exception:
                log.exception("event sink %s failed", name)
                self._metrics.listener_errors.labels(name).inc()
        return len(events)
