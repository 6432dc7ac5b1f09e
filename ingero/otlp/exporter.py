"""The OTLP exporter core fleet-push and Fleet's forwarder share: how a request is sent,
which failures are worth a retry, how long to wait before it.

- :class:`HttpExporter` and :class:`GrpcExporter` send one Export request to one receiver,
  with a timeout and the bearer token; every failure is one :class:`ExportError` saying
  whether a retry can help and how long the receiver asked the sender to wait.
- Which failures retry is one table per transport (:func:`retryable_http`,
  :func:`retryable_grpc`), the OTLP specification's with what ingero's receivers answer
  for a transient failure: an unreachable receiver, HTTP 408, 429 and every 5xx; gRPC
  UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED, CANCELLED, OUT_OF_RANGE, DATA_LOSS, INTERNAL,
  UNKNOWN (what a failing handler answers, like HTTP 500), and RESOURCE_EXHAUSTED only
  when the receiver sent RetryInfo (without it, it is a request too large to ever pass).
  Every other answer is a refusal: sent again it would be refused again.
- The wait the receiver asks for: HTTP ``Retry-After`` (delta-seconds or an HTTP-date) and
  gRPC ``google.rpc.RetryInfo`` in the status details; :class:`Backoff` waits
  exponentially longer, jittered, and at least that long.

- Which failures move a sender with several receivers (fleet-push's endpoints, no balancer
  in front) on to the next one (:class:`Failover`): the receiver could not be reached or did
  not answer in time, HTTP 5xx, gRPC UNAVAILABLE or DEADLINE_EXCEEDED. A refusal (4xx, a
  gRPC status saying the request is wrong) would be refused by any replica alike.

grpc is imported only by the gRPC exporter, so an HTTP-only fleet-push never loads it.
"""

from __future__ import annotations

import email.utils
import gzip
import http.client
import random
import ssl
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from google.protobuf.message import DecodeError, Message
from google.rpc.error_details_pb2 import RetryInfo
from google.rpc.status_pb2 import Status

from ingero.otlp.transport import HTTP_PATHS, PROTOBUF, Signal, export_method
from ingero.security.bearer import TokenSource, authorization, current_token
from ingero.security.tls import grpc_channel_credentials

if TYPE_CHECKING:
    import grpc

# How much of a refusal's body is read, and shown in its error.
_MAX_ERROR_BODY = 4096
_SHOWN = 200

_RETRY_GRPC = frozenset(
    {
        "UNAVAILABLE",
        "DEADLINE_EXCEEDED",
        "ABORTED",
        "CANCELLED",
        "OUT_OF_RANGE",
        "DATA_LOSS",
        "INTERNAL",
        "UNKNOWN",
    }
)
_FAILOVER_GRPC = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED"})
_STATUS_DETAILS = "grpc-status-details-bin"

T = TypeVar("T")
R = TypeVar("R")


class ExportError(Exception):
    """An export that failed: whether a retry can help (``retryable``), the seconds the
    receiver asked the sender to wait first (``retry_after``, None when it did not say), and
    whether another receiver of the same data may take it (``failover``: this one is down
    or failing, rather than refusing the request)."""

    def __init__(
        self,
        message: str,
        retryable: bool,
        retry_after: float | None = None,
        failover: bool = False,
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after
        self.failover = failover


def retryable_http(status: int) -> bool:
    """Whether an export answered HTTP ``status`` (not 2xx) may pass when sent again."""
    return status in (408, 429) or 500 <= status <= 599


def fails_over_http(status: int) -> bool:
    """Whether an HTTP answer ``status`` says the receiver is failing (try another one)."""
    return 500 <= status <= 599


def fails_over_grpc(code: str) -> bool:
    """Whether a gRPC status ``code`` (its name) says the receiver is down or failing."""
    return code in _FAILOVER_GRPC


def retryable_grpc(code: str, retry_info: bool = False) -> bool:
    """Whether an export that ended with gRPC status ``code`` (its name) may pass when sent
    again; ``retry_info``: the receiver sent RetryInfo with it."""
    return code in _RETRY_GRPC or (code == "RESOURCE_EXHAUSTED" and retry_info)


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a Retry-After value (delta-seconds or HTTP-date); None if unusable."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)


def grpc_retry_after(trailing_metadata: Iterable[tuple[str, str | bytes]] | None) -> float | None:
    """The delay of the ``google.rpc.RetryInfo`` in a failed call's status details, if any."""
    for key, value in trailing_metadata or ():
        if key != _STATUS_DETAILS or not isinstance(value, bytes):
            continue
        try:
            status = Status.FromString(value)
        except DecodeError:
            return None
        for detail in status.details:
            info = RetryInfo()
            if detail.Unpack(info):
                delay = info.retry_delay
                return max(0.0, float(delay.seconds) + float(delay.nanos) / 1e9)
    return None


def jittered(interval: float, jitter: float, rng: random.Random) -> float:
    """``interval`` spread uniformly by ±``jitter`` (a fraction) so nodes do not push in step."""
    return interval * (1.0 + rng.uniform(-jitter, jitter))


class Backoff:
    """Waits between retries of one request: ``initial``, doubling up to ``maximum``, each
    drawn from the upper half of the current delay (so senders that failed together do not
    retry together), and at least what the receiver asked for (capped at ``maximum``)."""

    def __init__(self, initial: float, maximum: float, rng: random.Random | None = None) -> None:
        self.initial = initial
        self.maximum = max(initial, maximum)
        self._rng = rng or random.Random()
        self._delay = initial

    def next(self, retry_after: float | None = None) -> float:
        """The wait before the next retry; the one after it will be longer."""
        wait = self._delay * self._rng.uniform(0.5, 1.0) + 0.01
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.maximum))
        self._delay = min(self._delay * 2, self.maximum)
        return wait

    def reset(self) -> None:
        """After a success: the next failure starts from ``initial`` again."""
        self._delay = self.initial


def refusal_message(body: bytes, content_type: str) -> str:
    """What a receiver's refusal says: the message of its ``google.rpc.Status`` (OTLP's
    refusal), else the start of its body as text."""
    if content_type.split(";", 1)[0].strip().lower() == PROTOBUF:
        try:
            return str(Status.FromString(body).message)[:_SHOWN]
        except DecodeError:
            pass
    return body.decode(errors="replace")[:_SHOWN]


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    headers: Mapping[str, str]  # lower-case names
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def error(self, receiver: str, now: float) -> ExportError:
        """This (not 2xx) answer as an ExportError."""
        message = refusal_message(self.body, self.headers.get("content-type", ""))
        return ExportError(
            f"{receiver} answered HTTP {self.status}" + (f": {message}" if message else ""),
            retryable_http(self.status),
            parse_retry_after(self.headers.get("retry-after"), now),
            failover=fails_over_http(self.status),
        )


class HttpExporter:
    """OTLP/HTTP to one receiver: ``http(s)://HOST:PORT[/PREFIX]``, Export requests posted
    as protobuf to ``PREFIX/v1/logs`` and ``PREFIX/v1/metrics``. ``https://`` verifies the
    receiver against ``ssl_context`` (None: the system's roots, or ``SSL_CERT_FILE``).
    Every request opens its own connection, closed when it is answered."""

    def __init__(
        self,
        endpoint: str,
        token: TokenSource,
        timeout: float,
        ssl_context: ssl.SSLContext | None = None,
        receiver: str = "the receiver",
        headers: Mapping[str, str] | None = None,
        compression: str = "none",
    ) -> None:
        """``headers`` go on every request (OTEL_EXPORTER_OTLP_HEADERS); ``compression``
        ``gzip`` compresses the bodies (Content-Encoding: gzip). ``token`` may be a callable
        (a :class:`~ingero.security.bearer.TokenFile`), asked on every request, so a rotated token
        is sent from the next request on."""
        url = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"endpoint must be http(s)://HOST:PORT, got {endpoint!r}")
        self.url = url
        prefix = url.path.rstrip("/")
        self.paths: dict[Signal, str] = {s: prefix + p for s, p in HTTP_PATHS.items()}
        self.timeout = timeout
        self.receiver = receiver
        self._ssl = ssl_context
        self._headers = {**(headers or {})}
        self._token = token
        self._gzip = compression == "gzip"

    def request(self, method: str, path: str, body: bytes | None = None) -> HttpAnswer:
        """One request; ExportError (retryable) when the receiver cannot be reached or does
        not answer within the timeout. A refusal's body is read only in part."""
        host, port = self.url.hostname or "", self.url.port
        if self.url.scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                host, port, timeout=self.timeout, context=self._ssl
            )
        else:
            conn = http.client.HTTPConnection(host, port, timeout=self.timeout)
        headers = {**self._headers, **({"Content-Type": PROTOBUF} if body is not None else {})}
        token = current_token(self._token)
        if token:
            headers["Authorization"] = authorization(token)
        if body is not None and self._gzip:
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        try:
            conn.request(method, path, body, headers)
            response = conn.getresponse()
            ok = 200 <= response.status < 300
            data = response.read() if ok else response.read(_MAX_ERROR_BODY)
            answer = {k.lower(): v for k, v in response.getheaders()}
        except (OSError, http.client.HTTPException) as exc:
            raise ExportError(
                f"cannot reach {self.receiver}: {exc}", retryable=True, failover=True
            ) from None
        finally:
            conn.close()
        return HttpAnswer(response.status, answer, data)

    def post(self, signal: Signal, request: Message) -> HttpAnswer:
        """POST an Export request; its answer, whatever the status."""
        return self.request("POST", self.paths[signal], request.SerializeToString())

    def send(self, request: Message) -> HttpAnswer:
        """POST an Export request; ExportError unless the receiver took it (2xx)."""
        answer = self.post(signal_of(request), request)
        if not answer.ok:
            raise answer.error(self.receiver, time.time())
        return answer

    def close(self) -> None:
        """Nothing to release: every request opens its own connection."""


class GrpcExporter:
    """OTLP/gRPC to one receiver: ``HOST:PORT`` (a ``grpc://`` prefix is dropped), with
    TLS for ``grpcs://HOST:PORT`` or when ``ca_file`` is given (trusted roots: that file,
    else grpc's defaults, which honour ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``)."""

    def __init__(
        self,
        endpoint: str,
        token: TokenSource,
        timeout: float,
        ca_file: str | None = None,
        receiver: str = "the receiver",
        headers: Mapping[str, str] | None = None,
        compression: str = "none",
    ) -> None:
        import grpc

        self._grpc = grpc
        target = endpoint.split("://", 1)[-1].rstrip("/")
        if endpoint.startswith("grpcs://") or ca_file:
            self.channel = grpc.secure_channel(target, grpc_channel_credentials(ca_file))
        else:
            self.channel = grpc.insecure_channel(target)
        # gRPC metadata keys must be lower case.
        self.metadata = [(k.lower(), v) for k, v in (headers or {}).items()]
        self._token = token
        self._compression = grpc.Compression.Gzip if compression == "gzip" else None
        self.timeout = timeout
        self.receiver = receiver
        self._methods: dict[Signal, Any] = {}

    def _method(self, signal: Signal) -> Any:
        if signal not in self._methods:
            self._methods[signal] = self.channel.unary_unary(
                export_method(signal),
                request_serializer=_serialize,
                response_deserializer=None,  # the response (a partial success) is not read
            )
        return self._methods[signal]

    def send(self, request: Message) -> grpc.Call:
        """Call Export; the finished call (its metadata), or ExportError."""
        try:
            _response, call = self._method(signal_of(request)).with_call(
                request,
                timeout=self.timeout,
                metadata=self._metadata(),
                compression=self._compression,
            )
        except self._grpc.RpcError as exc:
            raise self.error(exc) from None
        return call

    def _metadata(self) -> list[tuple[str, str]]:
        token = current_token(self._token)
        return [*self.metadata, ("authorization", authorization(token))] if token else self.metadata

    def error(self, exc: grpc.RpcError) -> ExportError:
        code = exc.code() if hasattr(exc, "code") else self._grpc.StatusCode.UNKNOWN
        details = exc.details() if hasattr(exc, "details") else str(exc)
        trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
        retry_after = grpc_retry_after(trailing)
        return ExportError(
            f"{self.receiver} answered {code.name}: {details}",
            retryable_grpc(code.name, retry_after is not None),
            retry_after,
            failover=fails_over_grpc(code.name),
        )

    def close(self) -> None:
        self.channel.close()


class Failover(Generic[T]):
    """Several receivers of the same data (exporters, one per endpoint), sticky on the one
    that works: without a balancer, a sender fails over by itself.

    :meth:`call` tries the current receiver; when it fails with ``ExportError.failover``
    (down or failing, not refusing), the next one in the list is tried within the same call
    and, if it takes the request, becomes current: the sender stays there (no flapping back
    while the first one restarts) until it fails in turn. A receiver that failed is left
    out for a wait from its own :class:`Backoff` (doubling while it keeps failing, at least
    its Retry-After); when every receiver is waiting, the one whose wait ends first is
    tried, so one call costs at most one attempt per receiver.
    """

    def __init__(
        self,
        targets: Sequence[T],
        backoff: Callable[[], Backoff],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not targets:
            raise ValueError("at least one receiver is needed")
        self.targets = tuple(targets)
        self._clock = clock
        self._backoffs = [backoff() for _ in self.targets]
        self._retry_at = [0.0] * len(self.targets)
        self.current = 0

    def order(self) -> list[int]:
        """The receivers one call tries, in order: the current one, then the others (in
        list order after it) whose back-off is over."""
        now = self._clock()
        n = len(self.targets)
        after = ((self.current + k) % n for k in range(1, n))
        return [self.current, *(i for i in after if self._retry_at[i] <= now)]

    def call(self, attempt: Callable[[T], R]) -> R:
        """``attempt(receiver)`` on the current receiver, then the next ones while it fails
        over; the first result, else the last ExportError. An error that is no reason to
        fail over (a refusal) is raised at once."""
        last: ExportError | None = None
        for i in self.order():
            try:
                result = attempt(self.targets[i])
            except ExportError as exc:
                if not exc.failover:
                    raise
                self._retry_at[i] = self._clock() + self._backoffs[i].next(exc.retry_after)
                last = exc
                continue
            self._backoffs[i].reset()
            self._retry_at[i] = 0.0
            self.current = i
            return result
        # Every receiver tried has failed: next time start with the one that waits least.
        self.current = min(range(len(self.targets)), key=self._retry_at.__getitem__)
        assert last is not None
        raise last


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def signal_of(request: Message) -> Signal:
    """``logs`` or ``metrics``: which Export ``request`` is for."""
    name = request.DESCRIPTOR.full_name
    if name == "opentelemetry.proto.collector.logs.v1.ExportLogsServiceRequest":
        return "logs"
    if name == "opentelemetry.proto.collector.metrics.v1.ExportMetricsServiceRequest":
        return "metrics"
    raise TypeError(f"not an OTLP Export request: {name}")
