"""OTLP's transport names, for the receiver core and the exporter core alike: the two
signals ingero sends, their OTLP/HTTP paths and gRPC services, the two media types, and
the cluster id header fleet-push sends on every request (a balancer in front of Fleet
replicas hashes on it, so every node of a cluster lands on one replica).

Kept apart from both cores (and free of grpc) so an HTTP-only fleet-push never loads grpc.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

# The pushing node's cluster id, on every fleet-push request: an HTTP header (OTLP/HTTP and
# the threshold API) and gRPC metadata (keys are lower case there). Informational: Fleet
# reads the cluster id from the OTLP resource, never from this header; it exists for
# load balancers (DESIGN.md "Contracts").
CLUSTER_ID_HEADER = "X-Ingero-Cluster-Id"
CLUSTER_ID_METADATA = "ingero-cluster-id"

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
