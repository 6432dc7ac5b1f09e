"""Pushes health to Fleet (OTLP/HTTP protobuf, or OTLP gRPC) and reads the threshold back.

The threshold comes in the push response (HTTP headers ``X-Ingero-Threshold``,
``X-Ingero-Quorum-Met``, ``X-Ingero-Panic``; gRPC metadata ``ingero-threshold``, …);
only when none of them is present is ``GET /api/v1/threshold`` polled. All three are read
by :mod:`ingero.otlp.threshold`, which rejects a value outside a sane range (not finite,
< 0, > 1, not ``true|false``): it is never used. Sending, timeouts, which failures retry
and the wait Fleet asks for (``Retry-After``, gRPC RetryInfo) are the OTLP exporter core's
(:mod:`ingero.otlp.exporter`), which Fleet's forwarder to Echo shares.
"""

from __future__ import annotations

import logging
import time
import urllib.parse
from dataclasses import dataclass
from typing import Protocol

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from ingero.bearer import token_source
from ingero.otlp.exporter import ExportError, GrpcExporter, HttpExporter, parse_retry_after
from ingero.otlp.ports import FLEET_API_PORT
from ingero.otlp.threshold import (
    API_PATH,
    ThresholdView,
    decode_headers,
    decode_json,
    decode_metadata,
)
from ingero.otlp.values import load_json
from ingero.push.config import PushConfig
from ingero.tls import client_ssl_context

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PushResult:
    ok: bool
    reading: ThresholdView | None = None
    retry_after: float | None = None  # seconds Fleet asked us to wait
    error: str | None = None


class PushClient(Protocol):
    def push(self, request: ExportMetricsServiceRequest) -> PushResult: ...

    def poll_threshold(self, cluster_id: str, job_id: str | None) -> ThresholdView | None: ...

    def export_logs(self, request: ExportLogsServiceRequest) -> None:
        """Send events; raises ExportError (the events channel retries a retryable one)."""

    def close(self) -> None: ...


def api_base(config: PushConfig) -> str:
    """Where Fleet's threshold API is: configured, else the push host on Fleet's API port."""
    if config.api_endpoint:
        return config.api_endpoint.rstrip("/")
    endpoint = config.fleet_endpoint
    if "://" not in endpoint:
        endpoint = "http://" + endpoint
    parts = urllib.parse.urlsplit(endpoint)
    scheme = "https" if parts.scheme == "https" or config.ca_file else "http"
    host = parts.hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{FLEET_API_PORT}"


class HttpPushClient:
    """OTLP/HTTP with protobuf bodies (``/v1/metrics``, ``/v1/logs``)."""

    def __init__(self, config: PushConfig) -> None:
        token = token_source(config.auth_token_file, "auth_token_file")
        context = client_ssl_context(config.ca_file)
        timeout = config.push_timeout
        self._otlp = HttpExporter(
            config.fleet_endpoint,
            token,
            timeout,
            context,
            "Fleet",
            headers=config.headers,
            compression=config.compression,
        )
        self._api = HttpExporter(
            api_base(config), token, timeout, context, "Fleet's API", headers=config.headers
        )

    def push(self, request: ExportMetricsServiceRequest) -> PushResult:
        try:
            answer = self._otlp.post("metrics", request)
        except ExportError as exc:  # refused, timed out, TLS: Fleet is unreachable
            return PushResult(ok=False, error=str(exc))
        retry_after = parse_retry_after(answer.headers.get("retry-after"), time.time())
        reading = None
        error = None if answer.ok else f"HTTP {answer.status}"
        try:
            reading = decode_headers(answer.headers)
        except ValueError as exc:
            log.warning("rejected threshold from Fleet: %s", exc)
            error = error or f"rejected: {exc}"
        return PushResult(answer.ok, reading, retry_after, error)

    def poll_threshold(self, cluster_id: str, job_id: str | None) -> ThresholdView | None:
        query = {"cluster_id": cluster_id, **({"job_id": job_id} if job_id else {})}
        path = f"{self._api.url.path.rstrip('/')}{API_PATH}?{urllib.parse.urlencode(query)}"
        try:
            answer = self._api.request("GET", path)
            if not answer.ok:
                raise answer.error(self._api.receiver, time.time())
            return decode_json(load_json(answer.body))
        except (ExportError, ValueError) as exc:
            log.debug("threshold API: %s", exc)
            return None

    def export_logs(self, request: ExportLogsServiceRequest) -> None:
        self._otlp.send(request)

    def close(self) -> None:
        self._otlp.close()
        self._api.close()


class GrpcPushClient:
    """OTLP gRPC (MetricsService/Export, LogsService/Export); threshold in response metadata."""

    def __init__(self, config: PushConfig) -> None:
        token = token_source(config.auth_token_file, "auth_token_file")
        self._otlp = GrpcExporter(
            config.fleet_endpoint,
            token,
            config.push_timeout,
            config.ca_file,
            "Fleet",
            headers=config.headers,
            compression=config.compression,
        )
        self._http = HttpPushClient(config)

    def push(self, request: ExportMetricsServiceRequest) -> PushResult:
        try:
            call = self._otlp.send(request)
        except ExportError as exc:
            return PushResult(ok=False, retry_after=exc.retry_after, error=str(exc))
        try:
            metadata = [*call.initial_metadata(), *call.trailing_metadata()]
            return PushResult(True, decode_metadata(metadata))
        except ValueError as exc:
            log.warning("rejected threshold from Fleet: %s", exc)
            return PushResult(True, None, error=f"rejected: {exc}")

    def poll_threshold(self, cluster_id: str, job_id: str | None) -> ThresholdView | None:
        return self._http.poll_threshold(cluster_id, job_id)

    def export_logs(self, request: ExportLogsServiceRequest) -> None:
        self._otlp.send(request)

    def close(self) -> None:
        self._otlp.close()


def make_client(config: PushConfig) -> PushClient:
    if config.transport == "grpc":
        return GrpcPushClient(config)
    return HttpPushClient(config)
