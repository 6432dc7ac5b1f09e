"""Pushes health to Fleet (OTLP/HTTP protobuf, or OTLP gRPC) and reads the threshold back.

The threshold comes in the push response (HTTP headers ``X-Ingero-Threshold``,
``X-Ingero-Quorum-Met``, ``X-Ingero-Panic``; gRPC metadata ``ingero-threshold``, …);
only when none of them is present is ``GET /api/v1/threshold`` polled. All three are read
by :mod:`ingero.otlp.threshold`, which rejects a value outside a sane range (not finite,
< 0, > 1, not ``true|false``): it is never used.
"""

from __future__ import annotations

import email.utils
import logging
import random
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from ingero.bearer import authorization, read_token
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
from ingero.tls import client_ssl_context, grpc_channel_credentials

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

    def export_logs(self, request: ExportLogsServiceRequest) -> None: ...

    def close(self) -> None: ...


def jittered(interval: float, jitter: float, rng: random.Random) -> float:
    """``interval`` spread uniformly by ±``jitter`` (a fraction) so nodes do not push in step."""
    return interval * (1.0 + rng.uniform(-jitter, jitter))


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
        self._base = config.fleet_endpoint.rstrip("/")
        self._api = api_base(config)
        self._timeout = config.push_timeout
        self._ssl = client_ssl_context(config.ca_file)
        token = read_token(config.auth_token_file, "auth_token_file")
        self._auth = {"Authorization": authorization(token)} if token else {}

    def _post(self, path: str, body: bytes) -> tuple[int, Mapping[str, str]]:
        headers = {"Content-Type": "application/x-protobuf", **self._auth}
        request = urllib.request.Request(self._base + path, body, headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self._timeout, context=self._ssl) as resp:
                resp.read()
                return resp.status, dict(resp.headers.items())
        except urllib.error.HTTPError as exc:
            exc.read()
            return exc.code, dict(exc.headers.items())

    def push(self, request: ExportMetricsServiceRequest) -> PushResult:
        try:
            status, headers = self._post("/v1/metrics", request.SerializeToString())
        except OSError as exc:  # refused, timed out, TLS: Fleet is unreachable
            return PushResult(ok=False, error=str(getattr(exc, "reason", exc)))
        lower = {k.lower(): v for k, v in headers.items()}
        retry_after = parse_retry_after(lower.get("retry-after"), time.time())
        reading = None
        error = None if 200 <= status < 300 else f"HTTP {status}"
        try:
            reading = decode_headers(headers)
        except ValueError as exc:
            log.warning("rejected threshold from Fleet: %s", exc)
            error = error or f"rejected: {exc}"
        return PushResult(200 <= status < 300, reading, retry_after, error)

    def poll_threshold(self, cluster_id: str, job_id: str | None) -> ThresholdView | None:
        query = {"cluster_id": cluster_id, **({"job_id": job_id} if job_id else {})}
        url = f"{self._api}{API_PATH}?{urllib.parse.urlencode(query)}"
        request = urllib.request.Request(url, headers=self._auth)
        try:
            with urllib.request.urlopen(request, timeout=self._timeout, context=self._ssl) as resp:
                return decode_json(load_json(resp.read()))
        except (OSError, ValueError) as exc:
            log.debug("threshold API: %s", exc)
            return None

    def export_logs(self, request: ExportLogsServiceRequest) -> None:
        status, _headers = self._post("/v1/logs", request.SerializeToString())
        if status == 429 or status >= 500:
            raise OSError(f"Fleet answered HTTP {status} to /v1/logs")
        if not 200 <= status < 300:
            raise ValueError(f"Fleet rejected the event: HTTP {status}")

    def close(self) -> None:
        """Nothing to release: every request opens its own connection."""


class GrpcPushClient:
    """OTLP gRPC (MetricsService/Export, LogsService/Export); threshold in response metadata."""

    def __init__(self, config: PushConfig) -> None:
        import grpc
        from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc

        self._grpc = grpc
        target = config.fleet_endpoint.split("://", 1)[-1].rstrip("/")
        if config.ca_file:
            self._channel = grpc.secure_channel(target, grpc_channel_credentials(config.ca_file))
        else:
            self._channel = grpc.insecure_channel(target)
        self._metrics = metrics_service_pb2_grpc.MetricsServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._logs = logs_service_pb2_grpc.LogsServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._timeout = config.push_timeout
        token = read_token(config.auth_token_file, "auth_token_file")
        self._metadata = [("authorization", authorization(token))] if token else []
        self._http = HttpPushClient(config)

    def push(self, request: ExportMetricsServiceRequest) -> PushResult:
        grpc = self._grpc
        try:
            _response, call = self._metrics.Export.with_call(
                request, timeout=self._timeout, metadata=self._metadata
            )
        except grpc.RpcError as exc:
            return PushResult(ok=False, error=f"gRPC {exc.code().name}: {exc.details()}")
        try:
            metadata = [*call.initial_metadata(), *call.trailing_metadata()]
            return PushResult(True, decode_metadata(metadata))
        except ValueError as exc:
            log.warning("rejected threshold from Fleet: %s", exc)
            return PushResult(True, None, error=f"rejected: {exc}")

    def poll_threshold(self, cluster_id: str, job_id: str | None) -> ThresholdView | None:
        return self._http.poll_threshold(cluster_id, job_id)

    def export_logs(self, request: ExportLogsServiceRequest) -> None:
        grpc = self._grpc
        try:
            self._logs.Export(request, timeout=self._timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise ValueError(f"Fleet rejected the event: {exc.details()}") from None
            raise OSError(f"gRPC {exc.code().name}: {exc.details()}") from None

    def close(self) -> None:
        self._channel.close()


def make_client(config: PushConfig) -> PushClient:
    if config.transport == "grpc":
        return GrpcPushClient(config)
    return HttpPushClient(config)
