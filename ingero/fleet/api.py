"""Fleet's API listener: ``/api/v1/threshold``, ``/metrics``, ``/healthz`` and ``/readyz``.

The bearer token, when configured, guards ``/api`` and ``/metrics``; the health probes stay
open so a supervisor can probe without a secret.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from urllib.parse import parse_qs

from prometheus_client import CONTENT_TYPE_LATEST

from ingero.access import Gate
from ingero.bearer import Identity
from ingero.fleet.httpserver import HttpRequest, HttpResponse
from ingero.fleet.metrics import FleetMetrics
from ingero.fleet.scope import Scope
from ingero.fleet.state import FleetState
from ingero.otlp.receiver import retry_after_value
from ingero.otlp.threshold import API_PATH, encode_json

_JSON = "application/json"


def json_response(status: int, payload: object) -> HttpResponse:
    return HttpResponse(status, json.dumps(payload).encode() + b"\n", _JSON)


class ApiHandler:
    def __init__(
        self,
        state: FleetState,
        metrics: FleetMetrics,
        gate: Gate[Scope],
        ready: Callable[[], bool],
    ) -> None:
        self._state = state
        self._metrics = metrics
        self._gate = gate
        self._ready = ready

    def gate(self, request: HttpRequest, length: int) -> HttpResponse | None:
        if request.method not in ("GET", "HEAD"):  # HEAD: the server sends the head only
            return json_response(405, {"error": "only GET and HEAD are supported"})
        if length:
            return json_response(400, {"error": "GET requests carry no body"})
        if request.path in ("/healthz", "/readyz"):
            return None
        message = "missing or wrong bearer token"
        admitted = self._gate.admit(
            "api", request.headers.get("authorization"), request.peer, message
        )
        if isinstance(admitted, Identity):
            return None
        if admitted.status == 401:
            self._metrics.count_rejected({"unauthorized": 1})
            response = json_response(401, {"error": message})
            response.headers.append(("WWW-Authenticate", 'Bearer realm="ingero-fleet"'))
            return response
        self._metrics.count_rejected({admitted.reason: 1})
        response = json_response(429, {"error": admitted.message})
        response.headers.append(("Retry-After", retry_after_value(admitted.retry_after or 1.0)))
        return response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path == API_PATH:
            return self._threshold(request.query)
        if request.path == "/metrics":
            return HttpResponse(200, self._metrics.render(), CONTENT_TYPE_LATEST)
        if request.path == "/healthz":
            return HttpResponse(200, b"ok\n")
        if request.path == "/readyz":
            return (
                HttpResponse(200, b"ready\n")
                if self._ready()
                else HttpResponse(503, b"not ready\n")
            )
        return json_response(404, {"error": f"no such path {request.path}"})

    def _threshold(self, query: str) -> HttpResponse:
        try:
            params = parse_qs(query, strict_parsing=bool(query), max_num_fields=16)
        except ValueError as exc:
            return json_response(400, {"error": f"bad query string: {exc}"})
        first = {key: values[-1] for key, values in params.items() if values}
        cluster_id = first.get("cluster_id")
        if not cluster_id:
            return json_response(400, {"error": "cluster_id is required"})
        job_id = first.get("job_id") or None
        workload = first.get("workload_type") or None
        # node_id: also that node's rate ratios and Fleet's open episode of it.
        node_id = first.get("node_id") or None
        view = self._state.threshold_view(cluster_id, job_id, workload, node_id)
        if view is None:
            return json_response(
                404,
                {
                    "error": "no such peer group",
                    "cluster_id": cluster_id,
                    "job_id": job_id,
                    "workload_type": workload,
                },
            )
        return json_response(200, encode_json(view))
