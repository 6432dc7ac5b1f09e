"""OTLP/gRPC receiver: the MetricsService and LogsService ``Export`` methods.

Requests are taken as raw bytes and decoded here, so a malformed message is answered with
INVALID_ARGUMENT and counted like on HTTP. The pushing node's group threshold goes back in
the initial metadata ``ingero-threshold`` (empty while none), ``ingero-quorum-met`` and
``ingero-panic`` (absent when no data point was accepted).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn

import grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from ingero.bearer import BearerAuth
from ingero.fleet.metrics import FleetMetrics
from ingero.fleet.receiver import Receiver
from ingero.otlp.threshold import encode_metadata
from ingero.otlp.values import OtlpDecodeError, parse_protobuf

METRICS_SERVICE = "opentelemetry.proto.collector.metrics.v1.MetricsService"
LOGS_SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"


class OtlpGrpcServer:
    def __init__(
        self,
        address: str,
        receiver: Receiver,
        metrics: FleetMetrics,
        auth: BearerAuth,
        max_body_bytes: int,
        credentials: grpc.ServerCredentials | None = None,
        workers: int = 8,
    ) -> None:
        self._address = address
        self._receiver = receiver
        self._metrics = metrics
        self._auth = auth
        self._credentials = credentials
        self._server = grpc.server(
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix="otlp-grpc"),
            options=[
                ("grpc.max_receive_message_length", max_body_bytes),
                # Without this a second Fleet on the same port would bind silently.
                ("grpc.so_reuseport", 0),
            ],
        )
        raw: Any = None  # identity deserializer: decoding happens in the handler
        self._server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    METRICS_SERVICE,
                    {
                        "Export": grpc.unary_unary_rpc_method_handler(
                            self._export_metrics,
                            request_deserializer=raw,
                            response_serializer=ExportMetricsServiceResponse.SerializeToString,
                        )
                    },
                ),
                grpc.method_handlers_generic_handler(
                    LOGS_SERVICE,
                    {
                        "Export": grpc.unary_unary_rpc_method_handler(
                            self._export_logs,
                            request_deserializer=raw,
                            response_serializer=ExportLogsServiceResponse.SerializeToString,
                        )
                    },
                ),
            )
        )

    def start(self) -> int:
        """Bind and serve; returns the bound port (OSError when the address is unavailable)."""
        try:
            if self._credentials is None:
                port = self._server.add_insecure_port(self._address)
            else:
                port = self._server.add_secure_port(self._address, self._credentials)
        except RuntimeError as exc:
            raise OSError(f"cannot bind {self._address}: {exc}") from None
        if port == 0:
            raise OSError(f"cannot bind {self._address}")
        self._server.start()
        return int(port)

    def stop(self, grace: float = 2.0) -> None:
        self._server.stop(grace).wait()

    def _abort(
        self,
        context: grpc.ServicerContext,
        signal: str,
        code: grpc.StatusCode,
        reason: str,
        message: str,
        start: float,
    ) -> NoReturn:
        self._receiver.refuse(reason)
        self._metrics.count_request("grpc", signal, code.name, time.perf_counter() - start)
        context.abort(code, message)
        raise AssertionError("grpc context.abort returned")  # abort always raises

    def _check(self, context: grpc.ServicerContext, signal: str, start: float) -> None:
        if self._auth.enabled:
            token = next(
                (str(v) for k, v in context.invocation_metadata() if k == "authorization"), None
            )
            if not self._auth.allows(token):
                self._abort(
                    context,
                    signal,
                    grpc.StatusCode.UNAUTHENTICATED,
                    "unauthorized",
                    "missing or wrong bearer token",
                    start,
                )

    def _export_metrics(
        self, raw: bytes, context: grpc.ServicerContext
    ) -> ExportMetricsServiceResponse:
        start = time.perf_counter()
        self._check(context, "metrics", start)
        try:
            request = parse_protobuf(raw, ExportMetricsServiceRequest)
        except OtlpDecodeError as exc:
            self._abort(
                context, "metrics", grpc.StatusCode.INVALID_ARGUMENT, "malformed", str(exc), start
            )
        reply = self._receiver.metrics_request(request)
        context.send_initial_metadata(encode_metadata(reply.view))
        response = ExportMetricsServiceResponse()
        if reply.rejected:
            response.partial_success.rejected_data_points = reply.rejected
            response.partial_success.error_message = reply.error_message
        self._metrics.count_request("grpc", "metrics", "OK", time.perf_counter() - start)
        return response

    def _export_logs(self, raw: bytes, context: grpc.ServicerContext) -> ExportLogsServiceResponse:
        start = time.perf_counter()
        self._check(context, "logs", start)
        try:
            request = parse_protobuf(raw, ExportLogsServiceRequest)
        except OtlpDecodeError as exc:
            self._abort(
                context, "logs", grpc.StatusCode.INVALID_ARGUMENT, "malformed", str(exc), start
            )
        reply = self._receiver.logs_request(request)
        response = ExportLogsServiceResponse()
        if reply.rejected:
            response.partial_success.rejected_log_records = reply.rejected
            response.partial_success.error_message = reply.error_message
        self._metrics.count_request("grpc", "logs", "OK", time.perf_counter() - start)
        return response
