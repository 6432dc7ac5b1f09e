"""Forwards events to Echo as OTLP logs: bounded queue, batches, retries with backoff.

``submit`` never blocks: it appends to a bounded queue, and when the queue is full the new
events are dropped and counted. One sender thread takes batches, and retries a batch that
failed for a transient reason (connection refused, timeout, 429, 5xx, gRPC UNAVAILABLE…)
with exponential backoff and jitter until Echo acknowledges it; Echo de-duplicates by
``event_id``, so a retry of a batch that was in fact stored doubles nothing. A batch Echo
refuses as invalid (other 4xx, INVALID_ARGUMENT) is dropped and counted, never retried.
"""

from __future__ import annotations

import http.client
import logging
import random
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from ingero.events import Event
from ingero.otlp.logs import encode_events

log = logging.getLogger("ingero.echo.forwarder")

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


class Sender(Protocol):
    def send(self, request: ExportLogsServiceRequest) -> None:
        """Deliver one request; raises SendError saying whether a retry can help."""

    def close(self) -> None: ...


class HttpSender:
    """OTLP/HTTP protobuf to ``<endpoint>/v1/logs``; ``https://`` verifies the server against
    the system's CAs (or ``SSL_CERT_FILE``)."""

    def __init__(self, endpoint: str, token: str | None = None, timeout: float = 10.0) -> None:
        url = urllib.parse.urlsplit(endpoint)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"echo endpoint must be http(s)://HOST:PORT, got {endpoint!r}")
        self.url = url
        self.path = url.path.rstrip("/") + "/v1/logs"
        self.token = token
        self.timeout = timeout

    def send(self, request: ExportLogsServiceRequest) -> None:
        cls = (
            http.client.HTTPSConnection
            if self.url.scheme == "https"
            else http.client.HTTPConnection
        )
        conn = cls(self.url.hostname or "", self.url.port, timeout=self.timeout)
        headers = {"Content-Type": "application/x-protobuf"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            conn.request("POST", self.path, request.SerializeToString(), headers)
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
                endpoint.removeprefix("grpcs://"), grpc.ssl_channel_credentials()
            )
        else:
            self.channel = grpc.insecure_channel(endpoint.removeprefix("grpc://"))
        self.stub = logs_service_pb2_grpc.LogsServiceStub(self.channel)  # type: ignore[no-untyped-call]
        self.metadata = [("authorization", f"Bearer {token}")] if token else None
        self.timeout = timeout

    def send(self, request: ExportLogsServiceRequest) -> None:
        try:
            self.stub.Export(request, timeout=self.timeout, metadata=self.metadata)
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
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}


class Forwarder:
    """The Echo event sink: ``submit(events)`` from any thread; one sender thread."""

    def __init__(
        self,
        sender: Sender | str,
        *,
        capacity: int = 100_000,
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
        self._queue: deque[Event] = deque()
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
        accepted = dropped = 0
        with self._cond:
            for event in events:
                if self._closing or len(self._queue) >= self.capacity:
                    dropped += 1
                    continue
                self._queue.append(event)
                accepted += 1
            if accepted:
                self._cond.notify()
        with self.stats._lock:
            self.stats.queued += accepted
            self.stats.dropped_full += dropped
            total = self.stats.dropped_full
        now = time.monotonic()
        if dropped and now >= self._next_drop_log:
            self._next_drop_log = now + _DROP_LOG_INTERVAL  # one line per interval, not per drop
            log.warning("echo forwarder queue full: dropped %d events (%d in all)", dropped, total)
        return accepted

    def pending(self) -> int:
        with self._cond:
            return len(self._queue) + self._inflight

    def flush(self, timeout: float) -> bool:
        """Wait until everything queued so far is acknowledged (or dropped); True if so."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._inflight, timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Try for ``timeout`` seconds to deliver what is queued, then drop (and count) the rest."""
        self.flush(timeout)
        with self._cond:
            self._closing = True
            left = len(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        self._thread.join(timeout=max(1.0, self.backoff_max))
        with self.stats._lock:
            self.stats.dropped_at_close += left
        self.sender.close()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closing)
                if self._closing:
                    return
                batch = [
                    self._queue.popleft() for _ in range(min(self.batch_size, len(self._queue)))
                ]
                self._inflight = len(batch)
            self._deliver(batch)
            with self._cond:
                self._inflight = 0
                self._cond.notify_all()

    def _deliver(self, batch: list[Event]) -> None:
        request = encode_events(batch)
        delay = self.backoff_initial
        while True:
            try:
                self.sender.send(request)
            except SendError as exc:
                with self.stats._lock:
                    self.stats.last_error = str(exc)
                if not exc.retryable:
                    log.error("echo refused %d events, dropped: %s", len(batch), exc)
                    with self.stats._lock:
                        self.stats.dropped_rejected += len(batch)
                    return
                with self.stats._lock:
                    self.stats.retries += 1
                log.warning(
                    "forwarding %d events failed, retrying in %.1fs: %s", len(batch), delay, exc
                )
                with self._cond:
                    if self._cond.wait_for(
                        lambda: self._closing, delay * random.uniform(0.5, 1.0) + 0.01
                    ):
                        with self.stats._lock:
                            self.stats.dropped_at_close += len(batch)
                        return
                delay = min(delay * 2, self.backoff_max)
                continue
            with self.stats._lock:
                self.stats.sent += len(batch)
            return
