"""OTLP/HTTP receiver: ``POST /v1/metrics`` and ``POST /v1/logs`` (protobuf or JSON, gzip).

Every reply to a metrics push carries the node's group threshold in ``X-Ingero-Threshold``
(empty while the group has none), ``X-Ingero-Quorum-Met`` and ``X-Ingero-Panic``; the three
are absent when no data point of the request was accepted. What a request may be and how a
refusal is answered (a ``google.rpc.Status`` in the request's encoding) is the OTLP
receiver core's (``ingero.otlp.receiver``), shared with Echo.
"""

from __future__ import annotations

import time

from ingero.fleet.httpserver import HttpRequest, HttpResponse
from ingero.fleet.metrics import FleetMetrics
from ingero.fleet.receiver import Receiver
from ingero.fleet.scope import CLUSTER_NOT_ALLOWED
from ingero.otlp.receiver import (
    REQUESTS,
    Reply,
    RequestError,
    decode_request,
    error_reply,
    method_not_allowed,
    not_found,
    refusal_error,
    reply_media,
    success_reply,
    too_large,
)
from ingero.otlp.threshold import encode_headers
from ingero.otlp.transport import JSON, SIGNAL_OF_PATH
from ingero.security.access import Gate
from ingero.security.bearer import Identity
from ingero.security.scope import ClusterScope

REALM = "ingero-fleet"


def _response(reply: Reply) -> HttpResponse:
    return HttpResponse(reply.status, reply.body, reply.content_type, reply.headers)


UNAUTHORIZED = "unauthorized"  # the counted reason of a 401 (the audit log has which check)
UNAUTHORIZED_MESSAGE = "missing or wrong bearer token"


def error_response(
    status: int, message: str, content_type: str | None = None, retry_after: float | None = None
) -> HttpResponse:
    """A refusal in the encoding of a request of ``content_type``."""
    return _response(error_reply(status, message, reply_media(content_type), REALM, retry_after))


class OtlpHttpHandler:
    """The request handler and the pre-body gate of the OTLP/HTTP listener."""

    def __init__(
        self,
        receiver: Receiver,
        metrics: FleetMetrics,
        gate: Gate[ClusterScope],
        max_body_bytes: int,
    ) -> None:
        self._receiver = receiver
        self._metrics = metrics
        self._gate = gate
        self._max_body = max_body_bytes

    def gate(self, request: HttpRequest, length: int) -> HttpResponse | None:
        signal = SIGNAL_OF_PATH.get(request.path)
        if signal is None:
            return self._refused(request, "other", not_found())
        if request.method != "POST":
            return self._refused(request, signal, method_not_allowed())
        admitted = self._gate.admit(
            "otlp-http", request.headers.get("authorization"), request.peer, UNAUTHORIZED_MESSAGE
        )
        if not isinstance(admitted, Identity):
            return self._refused(request, signal, refusal_error(admitted, UNAUTHORIZED))
        if length > self._max_body:
            return self._refused(request, signal, too_large(self._max_body))
        request.identity = admitted
        return None

    def _refused(self, request: HttpRequest, signal: str, error: RequestError) -> HttpResponse:
        self._receiver.refuse(error.reason)
        self._metrics.count_request("http", signal, str(error.status), 0.0)
        return error_response(
            error.status, str(error), request.headers.get("content-type"), error.retry_after
        )

    def __call__(self, request: HttpRequest) -> HttpResponse:
        start = time.perf_counter()
        signal = SIGNAL_OF_PATH[request.path]  # the gate let only known paths through
        content_type = request.headers.get("content-type")
        media = reply_media(content_type)
        try:
            message = decode_request(
                request.body,
                content_type,
                request.headers.get("content-encoding"),
                self._max_body,
                REQUESTS[signal],
            )
            reply = self._receiver.request(signal, message, request.identity)
            if reply.rejected:
                response = _response(success_reply(self._receiver.response(signal, reply), media))
            else:  # the common answer, an empty Export response: no message to build
                response = HttpResponse(200, b"{}" if media == JSON else b"", media)
            if signal == "metrics":
                response.headers = encode_headers(reply.view)
        except RequestError as exc:
            self._receiver.refuse(exc.reason)
            if exc.reason == CLUSTER_NOT_ALLOWED:
                self._gate.deny("otlp-http", request.identity, request.peer, exc.reason)
            response = error_response(exc.status, str(exc), content_type)
        self._metrics.count_request(
            "http", signal, str(response.status), time.perf_counter() - start
        )
        return response
