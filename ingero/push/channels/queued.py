"""A bounded queue drained by one sender thread: the base of channels whose consumer may stall."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading

from ingero.otlp.exporter import Backoff, ExportError
from ingero.schema.events import Event

log = logging.getLogger(__name__)


class QueuedChannel:
    """``send`` enqueues without waiting; a full queue drops the event and counts it.

    Subclasses implement ``_deliver`` (may block, may raise ``OSError`` or a retryable
    ``ExportError``) and ``_reset`` (drop a broken connection). A failed delivery is retried
    after ``retry_delay`` seconds (growing with jitter up to ``max_retry_delay``, and at
    least the wait a receiver asked for) while the event stays at the head of the queue, so
    a consumer that comes back late still gets everything the queue could hold. Any other
    error drops the event.
    """

    name = "queued"

    def __init__(
        self, queue_size: int, retry_delay: float = 0.5, max_retry_delay: float | None = None
    ) -> None:
        self._queue: queue.Queue[Event | None] = queue.Queue(maxsize=queue_size)
        self._backoff = Backoff(retry_delay, max_retry_delay or retry_delay)
        self._retry_delay = retry_delay
        self._grows = max_retry_delay is not None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._counts = {"sent": 0, "dropped": 0, "errors": 0}
        self._thread = threading.Thread(target=self._run, name=f"ingero-{self.name}", daemon=True)
        self._thread.start()

    def send(self, event: Event) -> None:
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self._count("dropped")

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {**self._counts, "queued": self._queue.qsize()}

    def close(self, timeout: float = 1.0) -> None:
        """Stop the sender; what is still queued after ``timeout`` is counted as dropped."""
        self._stop.set()
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)
        self._thread.join(timeout)
        left = 0
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            left += item is not None
        if left:
            self._count("dropped", left)
        self._reset()

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] += n

    def _run(self) -> None:
        while not self._stop.is_set():
            event = self._queue.get()
            if event is None:
                return
            while not self._stop.is_set():
                try:
                    self._deliver(event)
                except (OSError, ExportError) as exc:
                    if isinstance(exc, ExportError) and not exc.retryable:
                        log.warning("%s: dropped event %s: %s", self.name, event.event_id, exc)
                        self._count("dropped")
                        break
                    self._count("errors")
                    log.debug("%s: delivery failed: %s", self.name, exc)
                    self._reset()
                    self._stop.wait(self._retry_wait(exc))
                    continue
                except Exception as exc:  # one undeliverable event must not stop the channel
                    log.warning("%s: dropped event %s: %s", self.name, event.event_id, exc)
                    self._count("dropped")
                    break
                self._count("sent")
                self._backoff.reset()
                break
            else:
                self._count("dropped")

    def _retry_wait(self, exc: Exception) -> float:
        retry_after = exc.retry_after if isinstance(exc, ExportError) else None
        if self._grows or retry_after is not None:
            return self._backoff.next(retry_after)
        return self._retry_delay  # a local consumer (a socket): a fixed, short wait

    def _deliver(self, event: Event) -> None:
        raise OSError("no transport")

    def _reset(self) -> None:
        """Forget a broken connection; the next delivery reconnects."""
