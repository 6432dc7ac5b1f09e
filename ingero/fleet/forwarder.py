"""Fleet's exporter to Echo: forwards events (OTLP logs) and score samples (OTLP metrics)
with bounded queues, batches, retries with backoff.

``submit`` and ``submit_scores`` never block: they append to a bounded queue (one for
events, one for score samples), and when it is full the new items are dropped and counted.
Events go first when both wait. One sender thread takes batches, and retries a batch that
failed for a transient reason (connection refused, timeout, 429, 5xx, gRPC UNAVAILABLE…)
with exponential backoff and jitter until Echo acknowledges it; Echo de-duplicates by
``event_id``, so a retry of a batch that was in fact stored doubles nothing. A batch Echo
refuses as invalid (other 4xx, INVALID_ARGUMENT) is dropped and counted, never retried.
Score samples are safe to resend too: Echo ignores a node's sample not newer than its last.
"""

from __future__ import annotations

import http.client
import logging
import random
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from ingero.bearer import authorization
from ingero.events import Event
from ingero.fleet.score_history import ScoreSample, encode_scores
from ingero.otlp.logs import encode_events
from ingero.tls import grpc_channel_credentials

log = logging.getLogger(__name__)

T = TypeVar("T")

_DROP_LOG_INTERVAL = 10.0
_RETRY_HTTP = frozenset({408, 429, 500, 502, 503, 504})
_RETRY_GRPC = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.INTERNAL,
    }
)


class SendError(Exception):
    def __init__(self, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


Request = ExportLogsServiceRequest | ExportMetricsServiceRequest


class Sender(Protocol):
    def send(self, request: Request) -> None:
        """Deliver one request; raises SendError saying whether a retry can help."""

    def close(self) -> None: ...


class HttpSender:
    """OTLP/HTTP protobuf to ``<endpoint>/v1/logs`` (``/v1/metrics`` for score samples);
    ``https://`` verifies the server against the system's CAs (or ``SSL_CERT_FILE``)."""

    def __init__(self, endpoint: str, token: str | None = None, timeout: float = 10.0) -> None:
        url = urllib.parse.urlsplit(endpoint)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"echo endpoint must be http(s)://HOST:PORT, got {endpoint!r}")
        self.url = url
        self.path = url.path.rstrip("/") + "/v1/logs"
        self.metrics_path = url.path.rstrip("/") + "/v1/metrics"
        self.token = token
        self.timeout = timeout

    def send(self, request: Request) -> None:
        path = self.path if isinstance(request, ExportLogsServiceRequest) else self.metrics_path
        cls = (
            http.client.HTTPSConnection
            if self.url.scheme == "https"
            else http.client.HTTPConnection
        )
        conn = cls(self.url.hostname or "", self.url.port, timeout=self.timeout)
        headers = {"Content-Type": "application/x-protobuf"}
        if self.token:
            headers["Authorization"] = authorization(self.token)
        try:
            conn.request("POST", path, request.SerializeToString(), headers)
            response = conn.getresponse()
            body = response.read(2048)
        except (OSError, http.client.HTTPException) as exc:
            raise SendError(f"cannot reach echo: {exc}", retryable=True) from None
        finally:
            conn.close()
        if response.status == 200:
            return
        raise SendError(
            f"echo answered {response.status}: {body.decode(errors='replace')[:200]}",
            retryable=response.status in _RETRY_HTTP,
        )

    def close(self) -> None:
        return None


class GrpcSender:
    """OTLP/gRPC to ``HOST:PORT`` (``grpc://`` prefix optional), or with TLS to
    ``grpcs://HOST:PORT`` (trusted roots: grpc's defaults, which honour
    ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``)."""

    def __init__(self, endpoint: str, token: str | None = None, timeout: float = 10.0) -> None:
        if endpoint.startswith("grpcs://"):
            self.channel = grpc.secure_channel(
                endpoint.removeprefix("grpcs://"), grpc_channel_credentials(None)
            )
        else:
            self.channel = grpc.insecure_channel(endpoint.removeprefix("grpc://"))
        self.stub = logs_service_pb2_grpc.LogsServiceStub(self.channel)  # type: ignore[no-untyped-call]
        self.metrics_stub = metrics_service_pb2_grpc.MetricsServiceStub(self.channel)  # type: ignore[no-untyped-call]
        self.metadata = [("authorization", authorization(token))] if token else None
        self.timeout = timeout

    def send(self, request: Request) -> None:
        stub = self.stub if isinstance(request, ExportLogsServiceRequest) else self.metrics_stub
        try:
            stub.Export(request, timeout=self.timeout, metadata=self.metadata)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            details = exc.details() if hasattr(exc, "details") else str(exc)
            raise SendError(f"echo answered {code.name}: {details}", code in _RETRY_GRPC) from None

    def close(self) -> None:
        self.channel.close()


def make_sender(endpoint: str, token: str | None = None) -> Sender:
    if endpoint.startswith(("http://", "https://")):
        return HttpSender(endpoint, token)
    return GrpcSender(endpoint, token)


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
        token: str | None = None,
    ) -> None:
        self.sender = make_sender(sender, token) if isinstance(sender, str) else sender
        self.capacity = capacity
        self.batch_size = batch_size
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.stats = ForwarderStats()
        self._events: _Lane[Event] = _Lane("events", "", capacity, encode_events)
        self._scores: _Lane[ScoreSample] = _Lane(
            "score samples", "scores_", score_capacity, encode_scores
        )
        self._cond = threading.Condition()
        self._closing = False
        self._inflight = 0
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
        return len(self._events.items) + len(self._scores.items)

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
        self.sender.close()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queued() or self._closing)
                if self._closing:
                    return
                # Events first: an episode matters more than one more point of history.
                lane: _Lane[Any] = self._events if self._events.items else self._scores
                batch = [lane.items.popleft() for _ in range(min(self.batch_size, len(lane.items)))]
                self._inflight = len(batch)
            self._deliver(lane, batch)
            with self._cond:
                self._inflight = 0
                self._cond.notify_all()

    def _deliver(self, lane: _Lane[T], batch: list[T]) -> None:
        request = lane.encode(batch)
        delay = self.backoff_initial
        while True:
            try:
                self.sender.send(request)
            except SendError as exc:
                with self.stats._lock:
                    self.stats.last_error = str(exc)
                if not exc.retryable:
                    log.error("echo refused %d %s, dropped: %s", len(batch), lane.noun, exc)
                    self.stats.add(lane.prefix, dropped_rejected=len(batch))
                    return
                self.stats.add("", retries=1)
                log.warning(
                    "forwarding %d %s failed, retrying in %.1fs: %s",
                    len(batch),
                    lane.noun,
                    delay,
                    exc,
                )
                with self._cond:
                    if self._cond.wait_for(
                        lambda: self._closing, delay * random.uniform(0.5, 1.0) + 0.01
                    ):
                        self.stats.add(lane.prefix, dropped_at_close=len(batch))
                        return
                delay = min(delay * 2, self.backoff_max)
                continue
            self.stats.add(lane.prefix, sent=len(batch))
            return
