"""OTLP/HTTP receiver: ``POST /v1/metrics`` and ``POST /v1/logs`` (protobuf or JSON, gzip).

Every reply to a metrics push carries the node's group threshold in ``X-Ingero-Threshold``
(empty while the group has none), ``X-Ingero-Quorum-Met`` and ``X-Ingero-Panic``; the three
are absent when no data point of the request was accepted. Refused requests get a
``google.rpc.Status`` body in the request's encoding, as the OTLP/HTTP spec asks.
"""

from __future__ import annotations

import time

from google.protobuf import json_format
from google.protobuf.message import Message
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from ingero.bearer import BearerAuth
from ingero.fleet.httpserver import HttpRequest, HttpResponse
from ingero.fleet.metrics import FleetMetrics
from ingero.fleet.receiver import (
    JSON,
    PROTOBUF,
    PushReply,
    Receiver,
    RequestError,
    inflate,
    media_type,
    parse_body,
)
from ingero.otlp.threshold import encode_headers

_SIGNALS = {"/v1/metrics": "metrics", "/v1/logs": "logs"}
# gRPC status codes for the google.rpc.Status body (INVALID_ARGUMENT, UNAUTHENTICATED, ...).
_GRPC_CODES = {400: 3, 401: 16, 404: 5, 405: 12, 411: 3, 413: 8, 415: 3}


def _encode(message: Message, media: str) -> HttpResponse:
    if not message.ByteSize():  # the common reply: full success, nothing to say
        return HttpResponse(200, b"{}" if media == JSON else b"", media)
    if media == JSON:
        return HttpResponse(200, json_format.MessageToJson(message, indent=None).encode(), JSON)
    return HttpResponse(200, message.SerializeToString(), PROTOBUF)


def error_response(status: int, message: str, media: str = PROTOBUF) -> HttpResponse:
    response = _encode(Status(code=_GRPC_CODES.get(status, 2), message=message), media)
    response.status = status
    if status == 401:
        response.headers.append(("WWW-Authenticate", 'Bearer realm="ingero-fleet"'))
    return response


class OtlpHttpHandler:
    """The request handler and the pre-body gate of the OTLP/HTTP listener."""

    def __init__(
        self, receiver: Receiver, metrics: FleetMetrics, auth: BearerAuth, max_body_bytes: int
    ) -> None:
        self._receiver = receiver
        self._metrics = metrics
        self._auth = auth
        self._max_body = max_body_bytes

    def gate(self, request: HttpRequest, length: int) -> HttpResponse | None:
        signal = _SIGNALS.get(request.path)
        if signal is None:
            return self._refused(request, "other", RequestError(404, "not_found", "no such path"))
        if request.method != "POST":
            return self._refused(
                request, signal, RequestError(405, "method", "only POST is accepted")
            )
        if not self._auth.allows(request.headers.get("authorization")):
            error = RequestError(401, "unauthorized", "missing or wrong bearer token")
            return self._refused(request, signal, error)
        if length > self._max_body:
            error = RequestError(
                413, "too_large", f"body of {length} bytes exceeds limits.max_body_bytes"
            )
            return self._refused(request, signal, error)
        return None

    def _refused(self, request: HttpRequest, signal: str, error: RequestError) -> HttpResponse:
        self._receiver.refuse(error.reason)
        self._metrics.count_request("http", signal, str(error.status), 0.0)
        media = JSON if request.headers.get("content-type", "").startswith(JSON) else PROTOBUF
        return error_response(error.status, str(error), media)

    def __call__(self, request: HttpRequest) -> HttpResponse:
        start = time.perf_counter()
        signal = _SIGNALS[request.path]  # the gate let only known paths through
        media = PROTOBUF
        try:
            media = media_type(request.headers.get("content-type"))
            body = inflate(request.body, request.headers.get("content-encoding"), self._max_body)
            if signal == "metrics":
                reply = self._receiver.metrics_request(
                    parse_body(body, media, ExportMetricsServiceRequest)
                )
                response = _encode(_metrics_response(reply), media)
                response.headers = encode_headers(reply.view)
            else:
                reply = self._receiver.logs_request(
                    parse_body(body, media, ExportLogsServiceRequest)
                )
                response = _encode(_logs_response(reply), media)
        except RequestError as exc:
            self._receiver.refuse(exc.reason)
            response = error_response(exc.status, str(exc), media)
        self._metrics.count_request(
            "http", signal, str(response.status), time.perf_counter() - start
        )
        return response


def _metrics_response(reply: PushReply) -> ExportMetricsServiceResponse:
    response = ExportMetricsServiceResponse()
    if reply.rejected:
        response.partial_success.rejected_data_points = reply.rejected
        response.partial_success.error_message = reply.error_message
    return response


def _logs_response(reply: PushReply) -> ExportLogsServiceResponse:
    response = ExportLogsServiceResponse()
    if reply.rejected:
        response.partial_success.rejected_log_records = reply.rejected
        response.partial_success.error_message = reply.error_message
    return response
