"""Pushes health to Fleet (OTLP/HTTP protobuf, or OTLP gRPC) and reads the threshold back.

The threshold comes in the push response (HTTP headers ``X-Ingero-Threshold``,
``X-Ingero-Quorum-Met``, ``X-Ingero-Panic``; gRPC metadata ``ingero-threshold``, …);
only when none of them is present is ``GET /api/v1/threshold`` polled. All three are read
by :mod:`ingero.otlp.threshold`, which rejects a value outside a sane range (not finite,
< 0, > 1, not ``true|false``): it is never used. Sending, timeouts, which failures retry
and the wait Fleet asks for (``Retry-After``, gRPC RetryInfo) are the OTLP exporter core's
(:mod:`ingero.otlp.exporter`), which Fleet's forwarder to Echo shares; so is the failover
between several endpoints (``fleet_endpoint`` a list: sticky on the one that works, the next
one when it is down or answers 5xx/UNAVAILABLE). Every request carries the node's cluster
id (``X-Ingero-Cluster-Id``, gRPC ``ingero-cluster-id``) for a balancer to hash on.
"""

from __future__ import annotations

import logging
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from ingero.otlp.exporter import (
    Backoff,
    ExportError,
    Failover,
    GrpcExporter,
    HttpAnswer,
    HttpExporter,
    fails_over_http,
    parse_retry_after,
    refusal_message,
)
from ingero.otlp.ports import FLEET_API_PORT
from ingero.otlp.threshold import (
    API_PATH,
    ThresholdView,
    decode_headers,
    decode_json,
    decode_metadata,
)
from ingero.otlp.transport import CLUSTER_ID_HEADER, CLUSTER_ID_METADATA
from ingero.otlp.values import load_json
from ingero.push.config import PushConfig
from ingero.security.bearer import TokenSource, token_source
from ingero.security.tls import client_ssl_context

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PushResult:
    ok: bool
    reading: ThresholdView | None = None
    retry_after: float | None = None  # seconds Fleet asked us to wait
    error: str | None = None


class PushClient(Protocol):
    def push(self, request: ExportMetricsServiceRequest) -> PushResult: ...

    def poll_threshold(
        self, cluster_id: str, job_id: str | None, service: str | None = None
    ) -> ThresholdView | None: ...

    def export_logs(self, request: ExportLogsServiceRequest) -> None:
        """Send events; raises ExportError (the events channel retries a retryable one)."""

    def close(self) -> None: ...


def api_base(config: PushConfig, endpoint: str) -> str:
    """Where Fleet's threshold API is: configured, else ``endpoint``'s host on Fleet's API
    port."""
    if config.api_endpoint:
        return config.api_endpoint.rstrip("/")
    if "://" not in endpoint:
        endpoint = "http://" + endpoint
    parts = urllib.parse.urlsplit(endpoint)
    scheme = "https" if parts.scheme == "https" or config.ca_file else "http"
    host = parts.hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{FLEET_API_PORT}"


def endpoint_backoff(config: PushConfig) -> Backoff:
    """How long an endpoint that failed is left out: a push interval, doubling to twelve
    while it keeps failing (a minute at the default 5 s)."""
    interval = float(config.push_interval)
    return Backoff(interval, 12 * interval)


class _ThresholdApi:
    """Fleet's threshold API, polled only when a push answer carries no threshold; one per
    push endpoint (unless ``api_endpoint`` names one), the current endpoint's is asked."""

    def __init__(self, config: PushConfig, token: TokenSource) -> None:
        context = client_ssl_context(config.ca_file)
        headers = {**config.headers, CLUSTER_ID_HEADER: config.cluster_id}
        self._apis = [
            HttpExporter(
                api_base(config, endpoint),
                token,
                config.push_timeout,
                context,
                "Fleet's API",
                headers=headers,
            )
            for endpoint in config.fleet_endpoints
        ]

    def poll(
        self, endpoint: int, cluster_id: str, job_id: str | None, service: str | None = None
    ) -> ThresholdView | None:
        api = self._apis[endpoint]
        query = {"cluster_id": cluster_id, **({"job_id": job_id} if job_id else {})}
        if service and not job_id:  # the job groups first, as in Fleet's group key
            query["service"] = service
        path = f"{api.url.path.rstrip('/')}{API_PATH}?{urllib.parse.urlencode(query)}"
        try:
            answer = api.request("GET", path)
            if not answer.ok:
                raise answer.error(api.receiver, time.time())
            return decode_json(load_json(answer.body))
        except (ExportError, ValueError) as exc:
            log.debug("threshold API: %s", exc)
            return None


class _Failing(ExportError):
    """A 5xx answer as the failover's error, keeping the answer for the push result."""

    def __init__(self, answer: HttpAnswer, error: ExportError) -> None:
        super().__init__(str(error), error.retryable, error.retry_after, error.failover)
        self.answer = answer


class _Exporter(Protocol):
    def send(self, request: Message) -> object: ...

    def close(self) -> None: ...


X = TypeVar("X", bound=_Exporter)


class _FleetClient(Generic[X]):
    """What both transports share: one exporter per endpoint behind a Failover, the
    threshold API of the current endpoint, events sent like pushes."""

    def __init__(
        self, config: PushConfig, token: TokenSource, exporter: Callable[[str, str], X]
    ) -> None:
        """``exporter(endpoint, receiver name)`` builds the transport's exporter."""
        endpoints = config.fleet_endpoints
        self._otlp = Failover(
            [exporter(e, "Fleet" if len(endpoints) == 1 else f"Fleet at {e}") for e in endpoints],
            lambda: endpoint_backoff(config),
        )
        self._api = _ThresholdApi(config, token)
        self._ignored: tuple[str, ...] = ()

    def _say_ignored(self, rejected: list[str]) -> None:
        """One warning each time what Fleet's replies had ignored changes (a reply a push
        interval would otherwise log the same line every second); its text is bounded by
        the codec's messages."""
        said = tuple(rejected)
        if said and said != self._ignored:
            log.warning("ignored in Fleet's reply: %s", "; ".join(said))
        self._ignored = said

    def poll_threshold(
        self, cluster_id: str, job_id: str | None, service: str | None = None
    ) -> ThresholdView | None:
        return self._api.poll(self._otlp.current, cluster_id, job_id, service)

    def export_logs(self, request: ExportLogsServiceRequest) -> None:
        self._otlp.call(lambda exporter: exporter.send(request))

    def close(self) -> None:
        for exporter in self._otlp.targets:
            exporter.close()


class HttpPushClient(_FleetClient[HttpExporter]):
    """OTLP/HTTP with protobuf bodies (``/v1/metrics``, ``/v1/logs``)."""

    def __init__(self, config: PushConfig) -> None:
        token = token_source(config.auth_token_file, "auth_token_file")
        context = client_ssl_context(config.ca_file)
        headers = {**config.headers, CLUSTER_ID_HEADER: config.cluster_id}

        def exporter(endpoint: str, receiver: str) -> HttpExporter:
            return HttpExporter(
                endpoint,
                token,
                config.push_timeout,
                context,
                receiver,
                headers=headers,
                compression=config.compression,
            )

        super().__init__(config, token, exporter)

    def push(self, request: ExportMetricsServiceRequest) -> PushResult:
        def post(exporter: HttpExporter) -> HttpAnswer:
            answer = exporter.post("metrics", request)
            if fails_over_http(answer.status):  # failing, not refusing: try the next one
                raise _Failing(answer, answer.error(exporter.receiver, time.time()))
            return answer

        try:
            answer = self._otlp.call(post)
        except _Failing as exc:  # every endpoint tried answered 5xx: the last answer
            answer = exc.answer
        except ExportError as exc:  # refused, timed out, TLS: Fleet is unreachable
            return PushResult(ok=False, retry_after=exc.retry_after, error=str(exc))
        retry_after = parse_retry_after(answer.headers.get("retry-after"), time.time())
        reading = None
        error = None
        if not answer.ok:  # what Fleet said, so the one line logged says why (403: scope)
            said = refusal_message(answer.body, answer.headers.get("content-type", ""))
            error = f"HTTP {answer.status}" + (f": {said}" if said else "")
        rejected: list[str] = []
        try:
            reading = decode_headers(answer.headers, rejected)
            self._say_ignored(rejected)
        except ValueError as exc:
            log.warning("rejected threshold from Fleet: %s", exc)
            error = error or f"rejected: {exc}"
        return PushResult(answer.ok, reading, retry_after, error)


class GrpcPushClient(_FleetClient[GrpcExporter]):
    """OTLP gRPC (MetricsService/Export, LogsService/Export); threshold in response metadata."""

    def __init__(self, config: PushConfig) -> None:
        token = token_source(config.auth_token_file, "auth_token_file")
        metadata = {**config.headers, CLUSTER_ID_METADATA: config.cluster_id}

        def exporter(endpoint: str, receiver: str) -> GrpcExporter:
            return GrpcExporter(
                endpoint,
                token,
                config.push_timeout,
                config.ca_file,
                receiver,
                headers=metadata,
                compression=config.compression,
            )

        super().__init__(config, token, exporter)

    def push(self, request: ExportMetricsServiceRequest) -> PushResult:
        try:
            call = self._otlp.call(lambda exporter: exporter.send(request))
        except ExportError as exc:
            return PushResult(ok=False, retry_after=exc.retry_after, error=str(exc))
        rejected: list[str] = []
        try:
            metadata = [*call.initial_metadata(), *call.trailing_metadata()]
            reading = decode_metadata(metadata, rejected)
            self._say_ignored(rejected)
            return PushResult(True, reading)
        except ValueError as exc:
            log.warning("rejected threshold from Fleet: %s", exc)
            return PushResult(True, None, error=f"rejected: {exc}")


def make_client(config: PushConfig) -> PushClient:
    if config.transport == "grpc":
        return GrpcPushClient(config)
    return HttpPushClient(config)
