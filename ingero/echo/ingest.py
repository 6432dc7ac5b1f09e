"""OTLP receivers (logs and metrics; gRPC and HTTP) that feed the store.

A request is all or nothing: every record must decode and validate, else the whole request
is refused with a clear reason and counted, so nothing is ever stored half. The reply (and
so the sender's acknowledgement) is sent only after the store has committed the batch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

import grpc
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ingero.echo.auth import ANONYMOUS, Principal, TokenTable
from ingero.echo.store import ScorePoint, Store
from ingero.errors import UnavailableError
from ingero.events import Event
from ingero.otlp.health import SCORE_METRIC, decode_health
from ingero.otlp.logs import decode_events
from ingero.otlp.values import OtlpDecodeError, parse_json, parse_protobuf, to_json

log = logging.getLogger("ingero.echo.ingest")

# How long a receiver waits for the commit before telling the sender to retry.
COMMIT_TIMEOUT = 30.0


class IngestError(Exception):
    """A request refused as a whole; ``reason`` labels the rejection counter."""

    def __init__(self, reason: str, message: str, http_status: int = 400) -> None:
        super().__init__(message)
        self.reason = reason
        self.http_status = http_status


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


def logs_to_events(request: ExportLogsServiceRequest, max_events: int) -> list[Event]:
    """Every log record as an Event, or IngestError naming what is wrong."""
    total = sum(len(sl.log_records) for rl in request.resource_logs for sl in rl.scope_logs)
    if total > max_events:
        raise IngestError(
            "too_many_records",
            f"{total} log records in one request, the limit is {max_events}",
            413,
        )
    decoded = decode_events(request)
    if decoded.rejected:
        raise IngestError(
            "invalid_event",
            f"{decoded.rejected} of {total} log records rejected, nothing stored: "
            + decoded.error_message,
        )
    return decoded.events


def _score_times(request: ExportMetricsServiceRequest) -> Iterator[int]:
    # Same walk as decode_health: per resource, score metrics in order, then their points.
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == SCORE_METRIC:
                    kind = metric.WhichOneof("data")
                    points = metric.gauge.data_points if kind == "gauge" else metric.sum.data_points
                    for point in points:
                        yield point.time_unix_nano


def metrics_to_scores(
    request: ExportMetricsServiceRequest, max_points: int, now: float
) -> list[ScorePoint]:
    """Every health-score point as a ScorePoint (other metrics are ignored)."""
    decoded = decode_health(request)
    if decoded.rejected:
        raise IngestError(
            "invalid_metric",
            f"{decoded.rejected} data points rejected, nothing stored: {decoded.error_message}",
        )
    if len(decoded.pushes) > max_points:
        raise IngestError(
            "too_many_records",
            f"{len(decoded.pushes)} score points in one request, the limit is {max_points}",
            413,
        )
    return [
        ScorePoint(
            cluster_id=p.cluster_id,
            node_id=p.node_id,
            ts=(t / 1e9) if t else now,
            score=p.score,
            job_id=p.job_id,
            host_name=p.host_name,
            gpu_model=p.gpu_model,
            gpu_count=p.gpu_count,
            provider=p.provider,
        )
        for p, t in zip(decoded.pushes, _score_times(request), strict=True)
    ]


class Ingest:
    """Decoding, validation, counting and the commit wait shared by both transports."""

    def __init__(
        self,
        store: Store,
        max_request_bytes: int,
        max_events: int,
        tokens: TokenTable | None = None,
    ) -> None:
        self.store = store
        self.max_request_bytes = max_request_bytes
        self.max_events = max_events
        self.tokens = tokens or TokenTable([])
        self.stats = IngestStats()

    def authorize(self, authorization: str | None) -> Principal:
        """The sender's principal; with tokens configured, writing needs one too."""
        principal = self.tokens.authenticate(authorization)
        if principal is None:
            self.stats.reject("unauthenticated")
            raise IngestError("unauthenticated", "a valid bearer token is required", 401)
        return principal

    def _check_scope(self, principal: Principal, clusters: set[str]) -> None:
        outside = sorted(c for c in clusters if not principal.allows(c))
        if outside:
            raise IngestError(
                "forbidden_cluster",
                f"this token may not write cluster {outside[0]!r}; nothing stored",
                403,
            )

    def logs_future(
        self, request: ExportLogsServiceRequest, principal: Principal = ANONYMOUS
    ) -> concurrent.futures.Future[int]:
        try:
            events = logs_to_events(request, self.max_events)
            self._check_scope(principal, {e.cluster_id for e in events})
        except IngestError as exc:
            self.stats.reject(exc.reason)
            raise
        self.stats.count(events=len(events))
        return self.store.submit(events=events)

    def metrics_future(
        self, request: ExportMetricsServiceRequest, principal: Principal = ANONYMOUS
    ) -> concurrent.futures.Future[int]:
        try:
            scores = metrics_to_scores(request, self.max_events, self.store.clock.now())
            self._check_scope(principal, {p.cluster_id for p in scores})
        except IngestError as exc:
            self.stats.reject(exc.reason)
            raise
        self.stats.count(scores=len(scores))
        return self.store.submit(scores=scores)

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
        return await self._http(request, ExportLogsServiceRequest, ExportLogsServiceResponse)

    async def _http_metrics(self, request: Request) -> Response:
        return await self._http(request, ExportMetricsServiceRequest, ExportMetricsServiceResponse)

    async def _http(
        self, request: Request, req_cls: type[Message], resp_cls: type[Message]
    ) -> Response:
        content_type = request.headers.get("content-type", "").split(";")[0].strip()
        try:
            principal = self.authorize(request.headers.get("authorization"))
        except IngestError as exc:
            return _error(exc.http_status, str(exc))
        try:
            if content_type not in ("application/x-protobuf", "application/json"):
                raise IngestError(
                    "bad_content_type",
                    "Content-Type must be application/x-protobuf or application/json",
                    415,
                )
            body = await _read_limited(request, self.max_request_bytes)
        except IngestError as exc:
            self.stats.reject(exc.reason)
            return _error(exc.http_status, str(exc))
        try:
            # Decoding a big batch takes milliseconds: off the event loop, so small requests
            # (health checks, other senders' replies) are not held up behind it.
            future = await run_in_threadpool(
                self._decode_submit, body, content_type, req_cls, principal
            )
            await asyncio.wait_for(asyncio.wrap_future(future), COMMIT_TIMEOUT)
        except OtlpDecodeError as exc:
            self.stats.reject("malformed")
            return _error(400, str(exc))
        except IngestError as exc:
            return _error(exc.http_status, str(exc))
        except (UnavailableError, TimeoutError) as exc:
            return _error(503, f"not stored, retry: {exc or 'commit timed out'}")
        if content_type == "application/json":
            return Response(to_json(resp_cls()), media_type="application/json")
        return Response(resp_cls().SerializeToString(), media_type="application/x-protobuf")

    def _decode_submit(
        self, body: bytes, content_type: str, req_cls: type[Message], principal: Principal
    ) -> concurrent.futures.Future[int]:
        if content_type == "application/json":
            message = parse_json(body, req_cls)
        else:
            message = parse_protobuf(body, req_cls)
        if isinstance(message, ExportLogsServiceRequest):
            return self.logs_future(message, principal)
        assert isinstance(message, ExportMetricsServiceRequest)
        return self.metrics_future(message, principal)

    # -- OTLP/gRPC ---------------------------------------------------------------------------

    def grpc_server(
        self,
        address: str,
        credentials: grpc.ServerCredentials | None = None,
        workers: int = 16,
    ) -> tuple[grpc.Server, int]:
        """A started gRPC server on ``address`` (TLS with ``credentials``); returns it and
        the bound port."""
        server = grpc.server(
            concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="otlp"),
            options=[("grpc.max_receive_message_length", self.max_request_bytes)],
        )
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _LogsServicer(self), server
        )
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _MetricsServicer(self), server
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


_GRPC_CODES = {
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def _grpc_principal(ingest: Ingest, context: grpc.ServicerContext) -> Principal:
    metadata = dict(context.invocation_metadata() or ())
    try:
        return ingest.authorize(metadata.get("authorization"))
    except IngestError as exc:
        _grpc_abort(exc, context)


def _grpc_abort(exc: IngestError, context: grpc.ServicerContext) -> NoReturn:
    context.abort(_GRPC_CODES.get(exc.http_status, grpc.StatusCode.INVALID_ARGUMENT), str(exc))
    raise AssertionError("grpc's abort() raises; its type stubs do not say so")


def _grpc_wait(future: concurrent.futures.Future[int], context: grpc.ServicerContext) -> None:
    try:
        future.result(timeout=COMMIT_TIMEOUT)
    except (UnavailableError, concurrent.futures.TimeoutError) as exc:
        context.abort(grpc.StatusCode.UNAVAILABLE, f"not stored, retry: {exc}")


class _LogsServicer(logs_service_pb2_grpc.LogsServiceServicer):
    def __init__(self, ingest: Ingest) -> None:
        self.ingest = ingest

    def Export(  # the gRPC method name
        self, request: ExportLogsServiceRequest, context: grpc.ServicerContext
    ) -> ExportLogsServiceResponse:
        principal = _grpc_principal(self.ingest, context)
        try:
            future = self.ingest.logs_future(request, principal)
        except IngestError as exc:
            _grpc_abort(exc, context)
        _grpc_wait(future, context)
        return ExportLogsServiceResponse()


class _MetricsServicer(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, ingest: Ingest) -> None:
        self.ingest = ingest

    def Export(  # the gRPC method name
        self, request: ExportMetricsServiceRequest, context: grpc.ServicerContext
    ) -> ExportMetricsServiceResponse:
        principal = _grpc_principal(self.ingest, context)
        try:
            future = self.ingest.metrics_future(request, principal)
        except IngestError as exc:
            _grpc_abort(exc, context)
        _grpc_wait(future, context)
        return ExportMetricsServiceResponse()


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
