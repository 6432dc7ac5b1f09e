"""OTLP receivers (logs and metrics; gRPC and HTTP) that feed the store.

A request is all or nothing: every record must decode and validate, else the whole request
is refused with a clear reason and counted, so nothing is ever stored half. The reply (and
so the sender's acknowledgement) is sent only after the store has committed the batch.
Both transports hand the raw body to a ``DecodePool`` (``ingero.echo.decoding``), which
decodes it in worker processes, or in this process when it has none.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import grpc
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ingero.echo.auth import Principal, TokenTable
from ingero.echo.decoding import (
    JSON,
    PROTOBUF,
    Decoded,
    DecodePool,
    IngestError,
    Kind,
)
from ingero.echo.store import Store
from ingero.errors import UnavailableError
from ingero.otlp.values import OtlpDecodeError, to_json

log = logging.getLogger("ingero.echo.ingest")

# How long a receiver waits for the commit before telling the sender to retry.
COMMIT_TIMEOUT = 30.0
_RESPONSES: dict[Kind, type[Message]] = {
    "logs": ExportLogsServiceResponse,
    "metrics": ExportMetricsServiceResponse,
}
_GRPC_SERVICES: dict[Kind, str] = {
    "logs": "opentelemetry.proto.collector.logs.v1.LogsService",
    "metrics": "opentelemetry.proto.collector.metrics.v1.MetricsService",
}


@dataclass
class IngestStats:
    """Counters for ``/api/v1/status``; updated from several threads, hence the lock."""

    requests: int = 0
    events_received: int = 0
    scores_received: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, events: int = 0, scores: int = 0) -> None:
        with self._lock:
            self.requests += 1
            self.events_received += events
            self.scores_received += scores

    def reject(self, reason: str) -> None:
        with self._lock:
            self.requests += 1
            self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": self.requests,
                "events_received": self.events_received,
                "scores_received": self.scores_received,
                "rejected": dict(self.rejected),
            }


class Ingest:
    """Decoding, validation, counting and the commit wait shared by both transports."""

    def __init__(
        self,
        store: Store,
        max_request_bytes: int,
        max_events: int,
        tokens: TokenTable | None = None,
        decoder: DecodePool | None = None,
    ) -> None:
        self.store = store
        self.max_request_bytes = max_request_bytes
        self.max_events = max_events
        self.tokens = tokens or TokenTable([])
        self.decoder = decoder or DecodePool(0)
        self.stats = IngestStats()

    def authorize(self, authorization: str | None) -> Principal:
        """The sender's principal; with tokens configured, writing needs one too."""
        principal = self.tokens.authenticate(authorization)
        if principal is None:
            self.stats.reject("unauthenticated")
            raise IngestError("unauthenticated", "a valid bearer token is required", 401)
        return principal

    def accept(self, decoded: Decoded, principal: Principal) -> concurrent.futures.Future[int]:
        """Queue decoded records for the store once the principal may write every cluster
        in them; the future resolves once they are committed."""
        clusters = {row[2] for row in decoded.rows} | {p.cluster_id for p in decoded.scores}
        outside = sorted(c for c in clusters if not principal.allows(c))
        if outside:
            raise IngestError(
                "forbidden_cluster",
                f"this token may not write cluster {outside[0]!r}; nothing stored",
                403,
            )
        self.stats.count(events=len(decoded.rows), scores=len(decoded.scores))
        return self.store.submit(rows=decoded.rows, scores=decoded.scores)

    def _refused(self, exc: Exception) -> tuple[int, str]:
        """Count a refused request; its HTTP status and message."""
        if isinstance(exc, OtlpDecodeError):
            self.stats.reject("malformed")
            return 400, str(exc)
        if isinstance(exc, IngestError):
            self.stats.reject(exc.reason)
            return exc.http_status, str(exc)
        return 503, f"not stored, retry: {exc or 'commit timed out'}"

    # -- OTLP/HTTP ---------------------------------------------------------------------------

    def http_app(self) -> Starlette:
        async def http_error(request: Request, exc: Exception) -> Response:
            assert isinstance(exc, HTTPException)
            response = _error(exc.status_code, str(exc.detail))
            response.headers.update(exc.headers or {})
            return response

        return Starlette(
            routes=[
                Route("/v1/logs", self._http_logs, methods=["POST"]),
                Route("/v1/metrics", self._http_metrics, methods=["POST"]),
            ],
            exception_handlers={HTTPException: http_error},
        )

    async def _http_logs(self, request: Request) -> Response:
        return await self._http(request, "logs")

    async def _http_metrics(self, request: Request) -> Response:
        return await self._http(request, "metrics")

    async def _http(self, request: Request, kind: Kind) -> Response:
        content_type = request.headers.get("content-type", "").split(";")[0].strip()
        try:
            principal = self.authorize(request.headers.get("authorization"))
        except IngestError as exc:
            return _error(exc.http_status, str(exc))
        try:
            if content_type not in (PROTOBUF, JSON):
                raise IngestError(
                    "bad_content_type", f"Content-Type must be {PROTOBUF} or {JSON}", 415
                )
            body = await _read_limited(request, self.max_request_bytes)
            records = await self._decode(body, content_type, kind)
            future = self.accept(records, principal)
            await asyncio.wait_for(asyncio.wrap_future(future), COMMIT_TIMEOUT)
        except (OtlpDecodeError, IngestError, UnavailableError, TimeoutError) as exc:
            return _error(*self._refused(exc))
        response = _RESPONSES[kind]()
        if content_type == JSON:
            return Response(to_json(response), media_type=JSON)
        return Response(response.SerializeToString(), media_type=PROTOBUF)

    async def _decode(self, body: bytes, content_type: str, kind: Kind) -> Decoded:
        now = self.store.clock.now()
        return await self.decoder.decode(body, content_type, kind, self.max_events, now)

    # -- OTLP/gRPC ---------------------------------------------------------------------------

    def grpc_server(
        self,
        address: str,
        credentials: grpc.ServerCredentials | None = None,
        workers: int = 16,
    ) -> tuple[grpc.Server, int]:
        """A started gRPC server on ``address`` (TLS with ``credentials``); returns it and
        the bound port. Requests reach the handler as raw bytes, so decoding is ours (and
        can run in the decoding workers), not grpcio's."""
        server = grpc.server(
            concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="otlp"),
            options=[("grpc.max_receive_message_length", self.max_request_bytes)],
        )
        server.add_generic_rpc_handlers(
            tuple(
                grpc.method_handlers_generic_handler(
                    service,
                    {
                        "Export": grpc.unary_unary_rpc_method_handler(
                            self._grpc_export(kind),
                            response_serializer=_RESPONSES[kind].SerializeToString,
                        )
                    },
                )
                for kind, service in _GRPC_SERVICES.items()
            )
        )
        port = (
            server.add_secure_port(address, credentials)
            if credentials is not None
            else server.add_insecure_port(address)
        )
        if port == 0:
            raise UnavailableError(f"cannot listen for OTLP/gRPC on {address}")
        server.start()
        return server, port

    def _grpc_export(self, kind: Kind) -> Callable[[bytes, grpc.ServicerContext], Message]:
        def export(body: bytes, context: grpc.ServicerContext) -> Message:
            metadata = dict(context.invocation_metadata() or ())
            try:
                principal = self.authorize(metadata.get("authorization"))
            except IngestError as exc:
                _grpc_abort(context, exc.http_status, str(exc))
            try:
                now = self.store.clock.now()
                records = self.decoder.decode_sync(body, PROTOBUF, kind, self.max_events, now)
                self.accept(records, principal).result(timeout=COMMIT_TIMEOUT)
            except (
                OtlpDecodeError,
                IngestError,
                UnavailableError,
                concurrent.futures.TimeoutError,
            ) as exc:
                _grpc_abort(context, *self._refused(exc))
            return _RESPONSES[kind]()

        return export


_GRPC_CODES = {
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
}


def _grpc_abort(context: grpc.ServicerContext, http_status: int, message: str) -> NoReturn:
    context.abort(_GRPC_CODES.get(http_status, grpc.StatusCode.INVALID_ARGUMENT), message)
    raise AssertionError("grpc's abort() raises; its type stubs do not say so")


async def _read_limited(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise IngestError("too_large", f"request body over {limit} bytes", 413)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise IngestError("too_large", f"request body over {limit} bytes", 413)
        chunks.append(chunk)
    return b"".join(chunks)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "status": status}, status_code=status)
