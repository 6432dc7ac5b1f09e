"""Pushes health to Fleet (OTLP/HTTP protobuf, or OTLP gRPC) and reads the threshold back.

The threshold comes in the push response (HTTP headers ``X-Ingero-Threshold``,
``X-Ingero-Quorum-Met``, ``X-Ingero-Panic``; gRPC metadata ``ingero-threshold``, …);
only when none of them is present is ``GET /api/v1/threshold`` polled. A value outside a
sane range (not finite, < 0, > 1, not ``true|false``) is rejected, never used.
"""

from __future__ import annotations

import email.utils
import logging
import math
import random
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from ingero.errors import ConfigError
from ingero.otlp.values import load_json
from ingero.push.config import PushConfig
from ingero.push.detection import FleetReading

log = logging.getLogger(__name__)

HEADER_THRESHOLD = "X-Ingero-Threshold"
HEADER_QUORUM = "X-Ingero-Quorum-Met"
HEADER_PANIC = "X-Ingero-Panic"
_HEADERS = (HEADER_THRESHOLD, HEADER_QUORUM, HEADER_PANIC)
API_PORT = 8080


@dataclass(frozen=True)
class PushResult:
    ok: bool
    reading: FleetReading | None = None
    retry_after: float | None = None  # seconds Fleet asked us to wait
    error: str | None = None


class PushClient(Protocol):
    def push(self, request: ExportMetricsServiceRequest) -> PushResult: ...

    def poll_threshold(self, cluster_id: str, job_id: str | None) -> FleetReading | None: ...

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


def parse_threshold(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"threshold {value!r} is not a number") from None
    if not math.isfinite(number) or not 0.0 <= number <= 1.0:
        raise ValueError(f"threshold {value!r} is outside [0, 1]")
    return number


def parse_flag(value: str, name: str) -> bool:
    text = value.strip().lower()
    if text not in ("true", "false"):
        raise ValueError(f"{name} {value!r} is not true or false")
    return text == "true"


def reading_from_headers(headers: Mapping[str, str]) -> FleetReading | None:
    """The threshold in a response's headers (names case-insensitive); None when absent.

    Raises ValueError when present but insane.
    """
    lower = {k.lower(): v for k, v in headers.items()}
    values = [lower.get(h.lower()) for h in _HEADERS]
    if all(v is None for v in values):
        return None
    threshold, quorum, panic = values
    return FleetReading(
        threshold=parse_threshold(threshold) if threshold not in (None, "") else None,
        quorum_met=parse_flag(quorum, "quorum") if quorum is not None else False,
        panic=parse_flag(panic, "panic") if panic is not None else False,
    )


def reading_from_api(body: Any) -> FleetReading:
    """The threshold API's JSON answer; raises ValueError when it is not sane."""
    if not isinstance(body, dict):
        raise ValueError("threshold API answer is not a JSON object")
    raw = body.get("threshold")
    threshold: float | None = None
    if raw is not None:
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            raise ValueError(f"threshold {raw!r} is not a number")
        threshold = parse_threshold(repr(float(raw)))
    quorum, panic = body.get("quorum_met", False), body.get("panic", False)
    if not isinstance(quorum, bool) or not isinstance(panic, bool):
        raise ValueError("quorum_met and panic must be true or false")
    return FleetReading(threshold, quorum, panic)


def api_base(config: PushConfig) -> str:
    """Where Fleet's threshold API is: configured, else the push host on port 8080."""
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
    return f"{scheme}://{host}:{API_PORT}"


def read_token(path: str | None) -> str | None:
    if not path:
        return None
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"auth_token_file: cannot read {path}: {exc}") from None
    if not token:
        raise ConfigError(f"auth_token_file: {path} is empty")
    return token


def ssl_context(ca_file: str | None) -> ssl.SSLContext | None:
    if not ca_file:
        return None
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"ca_file: cannot load {ca_file}: {exc}") from None


class HttpPushClient:
    """OTLP/HTTP with protobuf bodies (``/v1/metrics``, ``/v1/logs``)."""

    def __init__(self, config: PushConfig) -> None:
        self._base = config.fleet_endpoint.rstrip("/")
        self._api = api_base(config)
        self._timeout = config.push_timeout
        self._ssl = ssl_context(config.ca_file)
        token = read_token(config.auth_token_file)
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}

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
            reading = reading_from_headers(headers)
        except ValueError as exc:
            log.warning("rejected threshold from Fleet: %s", exc)
            error = error or f"rejected: {exc}"
        return PushResult(200 <= status < 300, reading, retry_after, error)

    def poll_threshold(self, cluster_id: str, job_id: str | None) -> FleetReading | None:
        query = {"cluster_id": cluster_id, **({"job_id": job_id} if job_id else {})}
        url = f"{self._api}/api/v1/threshold?{urllib.parse.urlencode(query)}"
        request = urllib.request.Request(url, headers=self._auth)
        try:
            with urllib.request.urlopen(request, timeout=self._timeout, context=self._ssl) as resp:
                return reading_from_api(load_json(resp.read()))
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
            try:
                roots = Path(config.ca_file).read_bytes()
            except OSError as exc:
                raise ConfigError(f"ca_file: cannot read {config.ca_file}: {exc}") from None
            self._channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(roots))
        else:
            self._channel = grpc.insecure_channel(target)
        self._metrics = metrics_service_pb2_grpc.MetricsServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._logs = logs_service_pb2_grpc.LogsServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._timeout = config.push_timeout
        token = read_token(config.auth_token_file)
        self._metadata = [("authorization", f"Bearer {token}")] if token else []
        self._http = HttpPushClient(config)

    def push(self, request: ExportMetricsServiceRequest) -> PushResult:
        grpc = self._grpc
        try:
            _response, call = self._metrics.Export.with_call(
                request, timeout=self._timeout, metadata=self._metadata
            )
        except grpc.RpcError as exc:
            return PushResult(ok=False, error=f"gRPC {exc.code().name}: {exc.details()}")
        metadata: dict[str, str] = {}
        for key, value in [*call.initial_metadata(), *call.trailing_metadata()]:
            if isinstance(value, str) and key.startswith("ingero-"):
                metadata["x-" + key] = value
        try:
            return PushResult(True, reading_from_headers(metadata))
        except ValueError as exc:
            log.warning("rejected threshold from Fleet: %s", exc)
            return PushResult(True, None, error=f"rejected: {exc}")

    def poll_threshold(self, cluster_id: str, job_id: str | None) -> FleetReading | None:
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
