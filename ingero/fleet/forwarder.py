"""Fleet's exporter to Echo: forwards events (OTLP logs) and score samples (OTLP metrics)
with bounded queues, batches, retries with backoff (sending, which failures retry and the
waits are the OTLP exporter core's, :mod:`ingero.otlp.exporter`, which fleet-push shares).

``submit`` and ``submit_scores`` never block: they append to a bounded queue (one for
events, one for score samples), and when it is full the new items are dropped and counted.
Events go first when both wait. One sender thread takes batches, and retries a batch that
failed for a transient reason (connection refused, timeout, 408, 429, 5xx, gRPC
UNAVAILABLE…) with exponential backoff and jitter, and never sooner than Echo asked
(``Retry-After``, gRPC RetryInfo), until Echo acknowledges it; Echo de-duplicates by
``event_id``, so a retry of a batch that was in fact stored doubles nothing. A batch Echo
refuses as invalid (other 4xx, INVALID_ARGUMENT) is dropped and counted, never retried.
Score samples are safe to resend too: Echo ignores a node's sample not newer than its last.

With a spool (:mod:`ingero.fleet.spool`, ``echo.spool_dir``) the event queue is a SQLite
file instead of memory: ``submit`` returns once the events are committed there, a batch is
deleted only once Echo acknowledged (or refused) it, and what a killed process left is sent
first at the next start. Score samples stay in memory: losing some costs a point of history.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from ingero.fleet.metrics import EchoForwarding
from ingero.fleet.score_history import ScoreSample
from ingero.fleet.spool import EventSpool
from ingero.otlp.exporter import Backoff, ExportError, GrpcExporter, HttpExporter
from ingero.otlp.health import encode_score_history
from ingero.otlp.logs import encode_events
from ingero.schema.events import Event
from ingero.security.bearer import TokenSource

log = logging.getLogger(__name__)

T = TypeVar("T")

_DROP_LOG_INTERVAL = 10.0
TIMEOUT = 10.0  # of one request to Echo

Request = ExportLogsServiceRequest | ExportMetricsServiceRequest


class Sender(Protocol):
    def send(self, request: Request) -> Any:
        """Deliver one request; raises ExportError saying whether a retry can help."""

    def close(self) -> None: ...


def make_sender(endpoint: str, token: TokenSource = None) -> Sender:
    """OTLP/HTTP protobuf to ``http(s)://HOST:PORT[/PREFIX]`` (``https://`` verified against
    the system's CAs or ``SSL_CERT_FILE``), else OTLP/gRPC to ``HOST:PORT`` (``grpc://``
    prefix optional; TLS for ``grpcs://HOST:PORT``, trusted roots: grpc's defaults, which
    honour ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``)."""
    if endpoint.startswith(("http://", "https://")):
        return HttpExporter(endpoint, token, TIMEOUT, receiver="echo")
    return GrpcExporter(endpoint, token, TIMEOUT, receiver="echo")


@dataclass
class ForwarderStats:
    queued: int = 0
    sent: int = 0
    dropped_full: int = 0
    dropped_rejected: int = 0
    dropped_at_close: int = 0
    retries: int = 0
    last_error: str | None = None
    scores_queued: int = 0
    scores_sent: int = 0
    scores_dropped_full: int = 0
    scores_dropped_rejected: int = 0
    scores_dropped_at_close: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    def add(self, prefix: str, **counts: int) -> None:
        """Add to the counters named ``prefix + name`` (``""`` events, ``"scores_"`` samples)."""
        with self._lock:
            for name, n in counts.items():
                setattr(self, prefix + name, getattr(self, prefix + name) + n)


@dataclass
class _Lane(Generic[T]):
    """One bounded queue and how its batches are encoded and counted."""

    noun: str
    prefix: str  # of its ForwarderStats counters
    capacity: int
    encode: Callable[[list[T]], Request]
    items: deque[T] = field(default_factory=deque)
    # Durable store instead of ``items`` (events only); its ``max_*`` bound it, not capacity.
    spool: EventSpool | None = None

    def queued(self) -> int:
        return len(self.spool) if self.spool is not None else len(self.items)


class Forwarder:
    """The Echo event sink: ``submit(events)`` and ``submit_scores(samples)`` from any
    thread; one sender thread."""

    def __init__(
        self,
        sender: Sender | str,
        *,
        capacity: int = 100_000,
        score_capacity: int = 100_000,
        batch_size: int = 1000,
        backoff_initial: float = 0.2,
        backoff_max: float = 30.0,
        token: TokenSource = None,
        service: dict[str, object] | None = None,
        spool: EventSpool | None = None,
    ) -> None:
        """``token``: fixed, or a callable asked on every request (a TokenFile: a rotated
        token is sent without a restart). ``service``: Fleet's ``service.*`` resource
        attributes, on every request sent.
        ``spool``: keep the events there rather than in memory (``capacity`` then unused);
        the forwarder closes it."""
        self.sender = make_sender(sender, token) if isinstance(sender, str) else sender
        self.capacity = capacity
        self.batch_size = batch_size
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.stats = ForwarderStats()
        self._events: _Lane[Event] = _Lane(
            "events", "", capacity, lambda events: encode_events(events, service), spool=spool
        )
        self._scores: _Lane[ScoreSample] = _Lane(
            "score samples", "scores_", score_capacity, lambda s: encode_score_history(s, service)
        )
        self._cond = threading.Condition()
        self._closing = False
        self._inflight = 0
        self._inflight_lane: _Lane[Any] | None = None  # whose batch is in flight (memory)
        self._next_drop_log = 0.0
        self._thread = threading.Thread(target=self._run, name="echo-forwarder", daemon=True)
        self._thread.start()

    def __call__(self, events: Sequence[Event]) -> None:
        """So the forwarder itself is an event sink (``Callable[[Sequence[Event]], None]``)."""
        self.submit(events)

    def submit(self, events: Iterable[Event]) -> int:
        """Queue events without blocking; returns how many were accepted (the rest dropped)."""
        return self._submit(self._events, events)

    def submit_scores(self, samples: Iterable[ScoreSample]) -> int:
        """Queue score samples without blocking; returns how many were accepted."""
        return self._submit(self._scores, samples)

    def _submit(self, lane: _Lane[T], items: Iterable[T]) -> int:
        accepted = dropped = 0
        if lane.spool is not None:
            batch: list[Any] = list(items)
            # The write is outside the condition: the sender's reads and other submitters
            # wait on the spool's own lock only, never on a commit while holding this one.
            accepted = 0 if self._closing else lane.spool.append(batch)
            dropped = len(batch) - accepted
            if accepted:
                with self._cond:
                    self._cond.notify()
        else:
            with self._cond:
                for item in items:
                    if self._closing or len(lane.items) >= lane.capacity:
                        dropped += 1
                        continue
                    lane.items.append(item)
                    accepted += 1
                if accepted:
                    self._cond.notify()
        self.stats.add(lane.prefix, queued=accepted, dropped_full=dropped)
        now = time.monotonic()
        if dropped and now >= self._next_drop_log:
            self._next_drop_log = now + _DROP_LOG_INTERVAL  # one line per interval, not per drop
            total = self.stats.snapshot()[lane.prefix + "dropped_full"]
            log.warning(
                "echo forwarder queue full: dropped %d %s (%s in all)", dropped, lane.noun, total
            )
        return accepted

    def _queued(self) -> int:
        return self._events.queued() + self._scores.queued()

    def figures(self) -> EchoForwarding:
        """Its counters and queue depths, for ``/metrics``."""
        kinds: dict[str, _Lane[Any]] = {"events": self._events, "scores": self._scores}
        count = {k: v for k, v in self.stats.snapshot().items() if isinstance(v, int)}
        with self._cond:
            # a spool counts its batch in flight until done; memory lanes do not
            queued = {
                kind: lane.queued() + (self._inflight if lane is self._inflight_lane else 0)
                for kind, lane in kinds.items()
            }
        spool = self._events.spool
        return EchoForwarding(
            sent={kind: count[lane.prefix + "sent"] for kind, lane in kinds.items()},
            dropped={
                (kind, reason): count[f"{lane.prefix}dropped_{reason}"]
                for kind, lane in kinds.items()
                for reason in ("full", "rejected", "at_close")
            },
            queued=queued,
            retries=count["retries"],
            spool_bytes=spool.size_bytes() if spool is not None else None,
        )

    def pending(self) -> int:
        with self._cond:
            return self._queued() + self._inflight

    def flush(self, timeout: float) -> bool:
        """Wait until everything queued so far is acknowledged (or dropped); True if so."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queued() and not self._inflight, timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Try for ``timeout`` seconds to deliver what is queued, then drop (and count) the rest."""
        self.flush(timeout)
        with self._cond:
            self._closing = True
            left = {lane.prefix: len(lane.items) for lane in (self._events, self._scores)}
            self._events.items.clear()
            self._scores.items.clear()
            self._cond.notify_all()
        self._thread.join(timeout=max(1.0, self.backoff_max))
        for prefix, n in left.items():
            self.stats.add(prefix, dropped_at_close=n)
        spool = self._events.spool
        if spool is not None:
            if len(spool):  # kept, not lost: the next start sends them first
                log.warning(
                    "echo forwarder: %d events left in the spool %s", len(spool), spool.path
                )
            spool.close()
        self.sender.close()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queued() or self._closing)
                if self._closing:
                    return
                # Events first: an episode matters more than one more point of history.
                lane: _Lane[Any] = self._events if self._events.queued() else self._scores
                if lane.spool is None:
                    n = min(self.batch_size, len(lane.items))
                    batch = [lane.items.popleft() for _ in range(n)]
                    self._inflight = len(batch)
                    self._inflight_lane = lane
            if lane.spool is not None:
                # The batch stays counted in the spool until done: no _inflight needed.
                batch, bad = lane.spool.take(self.batch_size)
                if bad:
                    self.stats.add(lane.prefix, dropped_rejected=bad)
                if batch:
                    self._deliver(lane, batch)
                else:
                    lane.spool.done()
            else:
                self._deliver(lane, batch)
            with self._cond:
                self._inflight = 0
                self._inflight_lane = None
                self._cond.notify_all()

    def _deliver(self, lane: _Lane[T], batch: list[T]) -> None:
        request = lane.encode(batch)
        backoff = Backoff(self.backoff_initial, self.backoff_max)
        while True:
            try:
                self.sender.send(request)
            except ExportError as exc:
                with self.stats._lock:
                    self.stats.last_error = str(exc)
                if not exc.retryable:
                    log.error("echo refused %d %s, dropped: %s", len(batch), lane.noun, exc)
                    self.stats.add(lane.prefix, dropped_rejected=len(batch))
                    if lane.spool is not None:
                        lane.spool.done()
                    return
                self.stats.add("", retries=1)
                delay = backoff.next(exc.retry_after)
                log.warning(
                    "forwarding %d %s failed, retrying in %.1fs: %s",
                    len(batch),
                    lane.noun,
                    delay,
                    exc,
                )
                with self._cond:
                    if self._cond.wait_for(lambda: self._closing, delay):
                        if lane.spool is None:  # a spooled batch stays for the next start
                            self.stats.add(lane.prefix, dropped_at_close=len(batch))
                        return
                continue
            if lane.spool is not None:
                lane.spool.done()
            self.stats.add(lane.prefix, sent=len(batch))
            return
