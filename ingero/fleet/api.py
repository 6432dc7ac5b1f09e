"""Fleet's API listener: ``/api/v1/threshold``, ``/metrics``, ``/healthz`` and ``/readyz``.

The bearer token, when configured, guards ``/api`` and ``/metrics``; the health probes stay
open so a supervisor can probe without a secret, and say nothing about any cluster. A token
scoped to clusters reads only those (:mod:`ingero.fleet.read_scope`).

No answer repeats an id or a path the caller sent: an error says what was wrong, so an
answer to one tenant never holds another tenant's ids, whoever typed them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from urllib.parse import parse_qs

from prometheus_client import CONTENT_TYPE_LATEST

from ingero.fleet.httpserver import HttpRequest, HttpResponse
from ingero.fleet.metrics import FleetMetrics
from ingero.fleet.read_scope import CLUSTER_READ_NOT_ALLOWED, may_read, read_refusal, scope_of
from ingero.fleet.state import FleetState
from ingero.otlp.receiver import retry_after_value
from ingero.otlp.threshold import API_PATH, encode_json
from ingero.runtime.probes import CONTENT_TYPE, HEALTHZ, PATHS, error_body, probe_answer
from ingero.security.access import Gate, Refusal
from ingero.security.bearer import Identity
from ingero.security.scope import ClusterScope

_JSON = "application/json"


def json_response(status: int, payload: object) -> HttpResponse:
    """``payload`` as JSON; an error's (4xx, 5xx: ``{"error": message}``) gains its status,
    so an error is the same object on Fleet and Echo (``ingero.runtime.probes``)."""
    if status >= 400 and isinstance(payload, dict) and "error" in payload:
        payload = error_body(status, payload["error"])
    return HttpResponse(status, json.dumps(payload).encode() + b"\n", _JSON)


class ApiHandler:
    def __init__(
        self,
        state: FleetState,
        metrics: FleetMetrics,
        gate: Gate[ClusterScope],
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
        if request.path in PATHS:
            return None
        message = "missing or wrong bearer token"
        admitted = self._gate.admit(
            "api", request.headers.get("authorization"), request.peer, message
        )
        if isinstance(admitted, Identity):
            request.identity = admitted  # the handler reads within its token's scope
            return None
        if admitted.status == 401:
            self._metrics.count_rejected({"unauthorized": 1})
            response = json_response(401, {"error": message})
            response.headers.append(("WWW-Authenticate", 'Bearer realm="ingero-fleet"'))
            return response
        return self._too_many(admitted)

    def _too_many(self, refusal: Refusal) -> HttpResponse:
        self._metrics.count_rejected({refusal.reason: 1})
        response = json_response(429, {"error": refusal.message})
        response.headers.append(("Retry-After", retry_after_value(refusal.retry_after or 1.0)))
        return response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path == API_PATH:
            return self._threshold(request)
        if request.path == "/metrics":
            scope = scope_of(request.identity)
            body = self._metrics.render() if scope is None else self._metrics.render_clusters(scope)
            return HttpResponse(200, body, CONTENT_TYPE_LATEST)
        if request.path in PATHS:
            status, body = probe_answer(request.path == HEALTHZ or self._ready())
            return HttpResponse(status, body, CONTENT_TYPE)
        return json_response(404, {"error": "no such path"})

    def _threshold(self, request: HttpRequest) -> HttpResponse:
        query = request.query
        try:
            params = parse_qs(query, strict_parsing=bool(query), max_num_fields=16)
        except ValueError:
            return json_response(
                400, {"error": "bad query string: name=value fields, at most 16, '&' between"}
            )
        for name in _PARAMETERS:
            if len(params.get(name, ())) > 1:
                # Which one counts would be this parser's choice, not every proxy's in front.
                return json_response(400, {"error": f"{name} is given more than once"})
        first = {key: values[0] for key, values in params.items() if values}
        cluster_id = first.get("cluster_id")
        if not cluster_id:
            return json_response(400, {"error": "cluster_id is required"})
        if not may_read(scope_of(request.identity), cluster_id):
            # Before any lookup: the same answer whether that cluster exists or not.
            return self._refuse_read(request)
        job_id = first.get("job_id") or None
        workload = first.get("workload_type") or None
        # node_id: also that node's rate ratios and Fleet's open episode of it.
        node_id = first.get("node_id") or None
        service = first.get("service") or None  # an inference service's replicas
        view = self._state.threshold_view(cluster_id, job_id, workload, node_id, service)
        # A group key joins ids with '/', so an id holding '/' can spell another cluster's
        # key ("a" + job "x/job/y" is cluster "a/job/x"'s job "y"): that group is not this
        # cluster's, and is answered as one that does not exist.
        if view is None or view.cluster_id != cluster_id:
            return json_response(404, {"error": "no such peer group"})
        return json_response(200, encode_json(view))

    def _refuse_read(self, request: HttpRequest) -> HttpResponse:
        """403 for a cluster outside the token's scope: counted and audited like a push
        refused for one, and 429 once the source is over its rate of refusals."""
        limited = self._gate.deny_limited(
            "api", request.identity, request.peer, CLUSTER_READ_NOT_ALLOWED
        )
        if limited is not None:
            return self._too_many(limited)
        self._metrics.count_rejected({CLUSTER_READ_NOT_ALLOWED: 1})
        return json_response(403, {"error": read_refusal(request.identity)})


# The threshold API's parameters; unknown ones are ignored (an older Fleet, a newer node).
_PARAMETERS = ("cluster_id", "job_id", "workload_type", "node_id", "service")
