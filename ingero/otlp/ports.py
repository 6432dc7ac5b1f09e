"""Where Fleet listens unless configured otherwise.

Fleet's own configuration defaults and fleet-push's (its push endpoint, and the threshold
API it falls back to) both read them here, so a node finds an unconfigured Fleet without
either side retyping a number. OTLP's ports are the OpenTelemetry standard ones.
"""

from __future__ import annotations

FLEET_OTLP_GRPC_PORT = 4317
FLEET_OTLP_HTTP_PORT = 4318
FLEET_API_PORT = 8080  # GET /api/v1/threshold, /metrics, /healthz, /readyz
