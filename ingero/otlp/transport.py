"""OTLP's transport names, for the receiver core and the exporter core alike: the two
signals ingero sends, their OTLP/HTTP paths and gRPC services, and the two media types.

Kept apart from both cores (and free of grpc) so an HTTP-only fleet-push never loads grpc.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

Signal = Literal["logs", "metrics"]
# OTLP/HTTP paths and gRPC services, per signal.
HTTP_PATHS: Mapping[Signal, str] = {"logs": "/v1/logs", "metrics": "/v1/metrics"}
SIGNAL_OF_PATH: Mapping[str, Signal] = {path: signal for signal, path in HTTP_PATHS.items()}
SERVICES: Mapping[Signal, str] = {
    "logs": "opentelemetry.proto.collector.logs.v1.LogsService",
    "metrics": "opentelemetry.proto.collector.metrics.v1.MetricsService",
}


def export_method(signal: Signal) -> str:
    """The gRPC method path of ``signal``'s Export."""
    return f"/{SERVICES[signal]}/Export"
