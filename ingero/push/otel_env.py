"""The OpenTelemetry SDK's exporter environment variables, as fleet-push config defaults.

Per the OTLP exporter specification (opentelemetry.io/docs/specs/otel/protocol/exporter/):
``OTEL_EXPORTER_OTLP_ENDPOINT`` (base URL; ``/v1/metrics`` is appended for OTLP/HTTP),
``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` (the full metrics URL; wins over the base one),
``OTEL_EXPORTER_OTLP_HEADERS`` (``k=v,k2=v2``, values URL-encoded),
``OTEL_EXPORTER_OTLP_TIMEOUT`` (milliseconds), ``OTEL_EXPORTER_OTLP_PROTOCOL``
(``grpc``, ``http/protobuf``; ``http/json`` is not sent by fleet-push) and
``OTEL_EXPORTER_OTLP_COMPRESSION`` (``gzip``, ``none``). Each is used only where the config
file and the flags say nothing: flag > file > OTEL_* > default.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any

from ingero.runtime.errors import ConfigError

ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
METRICS_ENDPOINT = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
HEADERS = "OTEL_EXPORTER_OTLP_HEADERS"
TIMEOUT = "OTEL_EXPORTER_OTLP_TIMEOUT"
PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
COMPRESSION = "OTEL_EXPORTER_OTLP_COMPRESSION"

_PROTOCOLS = {"grpc": "grpc", "http/protobuf": "http"}
_METRICS_PATH = "/v1/metrics"


def _headers(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"{HEADERS}: expected key=value[,key=value], got {item.strip()!r}")
        out[urllib.parse.unquote(name.strip()).lower()] = urllib.parse.unquote(value.strip())
    return out


def otel_env_defaults(environ: Mapping[str, str]) -> dict[str, tuple[str, Any]]:
    """Dotted fleet-push config keys -> (variable, value) for ``load_config(env_defaults=)``."""
    found: dict[str, tuple[str, Any]] = {}
    env = {k: v.strip() for k, v in environ.items() if k.startswith("OTEL_") and v.strip()}
    if PROTOCOL in env:
        protocol = env[PROTOCOL].lower()
        if protocol not in _PROTOCOLS:
            raise ConfigError(
                f"{PROTOCOL}: fleet-push sends grpc or http/protobuf, got {env[PROTOCOL]!r}"
            )
        found["transport"] = (PROTOCOL, _PROTOCOLS[protocol])
    if METRICS_ENDPOINT in env:
        # A signal-specific URL is used as is; fleet-push's endpoint is the base its
        # exporter appends /v1/metrics and /v1/logs to, so the path comes off.
        url = env[METRICS_ENDPOINT].rstrip("/")
        if url.endswith(_METRICS_PATH):
            url = url[: -len(_METRICS_PATH)]
        found["fleet_endpoint"] = (METRICS_ENDPOINT, url)
    elif ENDPOINT in env:
        found["fleet_endpoint"] = (ENDPOINT, env[ENDPOINT].rstrip("/"))
    if HEADERS in env:
        found["headers"] = (HEADERS, _headers(env[HEADERS]))
    if TIMEOUT in env:
        try:
            millis = float(env[TIMEOUT])
        except ValueError:
            raise ConfigError(f"{TIMEOUT}: expected milliseconds, got {env[TIMEOUT]!r}") from None
        found["timeout"] = (TIMEOUT, millis / 1000.0)
    if COMPRESSION in env:
        found["compression"] = (COMPRESSION, env[COMPRESSION].lower())
    return found
