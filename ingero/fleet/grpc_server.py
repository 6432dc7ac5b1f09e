"""OTLP/gRPC receiver: the MetricsService and LogsService ``Export`` methods.

Requests are taken as raw bytes and decoded here, so a malformed message is answered with
INVALID_ARGUMENT and counted like on HTTP (the codes are the OTLP receiver core's table,
``ingero.otlp.receiver``). The pushing node's group threshold goes back in the initial
metadata ``ingero-threshold`` (empty while none), ``ingero-quorum-met`` and
``ingero-panic`` (absent when no data point was accepted).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import NoReturn

import grpc
from google.protobuf.message import Message

from ingero.fleet.metrics import FleetMetrics
from ingero.fleet.otlp_http import UNAUTHORIZED, UNAUTHORIZED_MESSAGE
from ingero.fleet.receiver import Receiver
from ingero.fleet.scope import CLUSTER_NOT_ALLOWED
from ingero.otlp.receiver import (
    GRPC_NO_REUSEPORT,
    REQUESTS,
    RequestError,
    abort,
    bind_grpc,
    grpc_code,
    grpc_handlers,
    parse_body,
    peer_host,
    refusal_error,
)
from ingero.otlp.threshold import encode_metadata
from ingero.otlp.transport import PROTOBUF, Signal
from ingero.security.access import Gate
from ingero.security.bearer import Identity
from ingero.security.scope import ClusterScope


class OtlpGrpcServer:
    def __init__(
        self,
        address: str,
        receiver: Receiver,
        metrics: FleetMetrics,
        gate: Gate[ClusterScope],
        max_body_bytes: int,
        credentials: grpc.ServerCredentials | None = None,
        workers: int = 8,
    ) -> None:
        self._address = address
        self._receiver = receiver
        self._metrics = metrics
        self._gate = gate
        self._credentials = credentials
        self._server = grpc.server(
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix="otlp-grpc"),
            options=[
                ("grpc.max_receive_message_length", max_body_bytes),
                GRPC_NO_REUSEPORT,
            ],
        )
        self._server.add_generic_rpc_handlers(
            grpc_handlers({"metrics": self._export("metrics"), "logs": self._export("logs")})
        )

    def start(self) -> int:
        """Bind and serve; returns the bound port (OSError when the address is unavailable)."""
        port = bind_grpc(self._server, self._address, self._credentials)
        self._server.start()
        return port

    def stop(self, grace: float = 2.0) -> None:
        self._server.stop(grace).wait()

    def _refuse(
        self, context: grpc.ServicerContext, signal: str, error: RequestError, start: float
    ) -> NoReturn:
        self._receiver.refuse(error.reason)
        code = grpc_code(error.status).name
        self._metrics.count_request("grpc", signal, code, time.perf_counter() - start)
        abort(context, error)

    def _authorize(
        self, context: grpc.ServicerContext, signal: str, start: float
    ) -> Identity[ClusterScope] | None:
        """The caller's identity (None with authentication off), or the call ends here."""
        if not self._gate.enabled:
            return None
        token = next(
            (str(v) for k, v in context.invocation_metadata() if k == "authorization"), None
        )
        admitted = self._gate.admit(
            "otlp-grpc", token, peer_host(context.peer()), UNAUTHORIZED_MESSAGE
        )
        if not isinstance(admitted, Identity):
            self._refuse(context, signal, refusal_error(admitted, UNAUTHORIZED), start)
        return admitted

    def _export(self, signal: Signal) -> Callable[[bytes, grpc.ServicerContext], Message]:
        def export(raw: bytes, context: grpc.ServicerContext) -> Message:
            start = time.perf_counter()
            identity = self._authorize(context, signal, start)
            try:
                request = parse_body(raw, PROTOBUF, REQUESTS[signal])
                reply = self._receiver.request(signal, request, identity)
            except RequestError as exc:
                if exc.reason == CLUSTER_NOT_ALLOWED:
                    self._gate.deny("otlp-grpc", identity, peer_host(context.peer()), exc.reason)
                self._refuse(context, signal, exc, start)
            if signal == "metrics":
                context.send_initial_metadata(encode_metadata(reply.view))
            self._metrics.count_request("grpc", signal, "OK", time.perf_counter() - start)
            return self._receiver.response(signal, reply)

        return export
