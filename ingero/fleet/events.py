"""The one exit point of Fleet's events: a bounded queue the tick thread drains to sinks.

Receivers and the tick submit (cheap, never blocks the hot path); the tick thread
delivers to every sink (the journal, Echo forwarding, ...). A sink that raises is
logged and counted and the others still get the events.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from ingero.fleet.metrics import FleetMetrics
from ingero.runtime.journald import EventJournal, stderr_is_journal
from ingero.runtime.systemd import JOURNAL_SOCKET
from ingero.schema.events import Event

log = logging.getLogger(__name__)

EventSink = Callable[[Sequence[Event]], None]
DEFAULT_CAPACITY = 100_000
# Event types whose stderr line is a warning (the journal entry's PRIORITY is the event's own).
_WARNINGS = frozenset(
    {
        "straggler_state",
        "group_degraded",
        "node_drained",
        "peer_lag",
        "collective_hang",
        "collective_wait",
    }
)


class JournalSink(EventJournal):
    """Every event to journald through the writer fleet-push uses (``ingero.runtime.journald``), so
    Fleet's drains, skips, group and straggler events are found as the node's are. The plain
    stderr line stays where stderr is not the journal already (a terminal, a container log)
    or the entry did not get through, so a run without journald still shows every decision."""

    def __init__(self, socket_path: str = JOURNAL_SOCKET, stderr_line: bool | None = None) -> None:
        super().__init__(socket_path)
        self._stderr_line = not stderr_is_journal() if stderr_line is None else stderr_line

    def __call__(self, events: Sequence[Event]) -> None:
        for event in events:
            if self.write(event) and not self._stderr_line:
                continue
            level = logging.WARNING if event.type in _WARNINGS else logging.INFO
            log.log(level, "%s event_id=%s", event.message(), event.event_id)


class EventQueue:
    def __init__(self, metrics: FleetMetrics, capacity: int = DEFAULT_CAPACITY) -> None:
        self._metrics = metrics
        self._queue: deque[tuple[Event, str]] = deque()
        self._capacity = capacity
        self._lock = threading.Lock()
        self._sinks: list[tuple[str, EventSink]] = []
        self._immediate: list[tuple[str, EventSink]] = []

    def add_sink(self, sink: EventSink, name: str | None = None, immediate: bool = False) -> None:
        """``immediate``: called by ``submit`` itself, in the submitter's thread, before the
        submitter answers (a durable sink: a node's request is acknowledged only once its
        events are stored); else by ``deliver`` on the tick thread."""
        entry = (name or str(getattr(sink, "__name__", sink)), sink)
        (self._immediate if immediate else self._sinks).append(entry)

    def submit(self, events: Iterable[Event], source: str) -> None:
        accepted: list[Event] = []
        with self._lock:
            for event in events:
                if len(self._queue) >= self._capacity:
                    self._metrics.events_dropped.inc()
                    continue
                self._queue.append((event, source))
                accepted.append(event)
        if accepted:
            self._call(self._immediate, accepted)

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
        self._call(self._sinks, events)
        return len(events)

    def _call(self, sinks: list[tuple[str, EventSink]], events: Sequence[Event]) -> None:
        for name, sink in sinks:
            try:
                sink(events)
            except Exception:
                log.exception("event sink %s failed", name)
                self._metrics.listener_errors.labels(name).inc()
