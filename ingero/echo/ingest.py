"""OTLP receivers (logs and metrics; gRPC and HTTP) that feed the store.

A request is all or nothing: every record must decode and validate, else the whole request
is refused with a clear reason and counted, so nothing is ever stored half. The reply (and
so the sender's acknowledgement) is sent only after the store has committed the batch.
Both transports hand the raw body to a ``DecodePool`` (``ingero.echo.decoding``), which
decodes it in worker processes, or in this process when it has none. What a request may be
on the wire (media types, gzip, size) and how a refusal is answered (a ``google.rpc.Status``
in the request's encoding, gRPC codes from one table) is the OTLP receiver core's
(``ingero.otlp.receiver``), shared with Fleet.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.message import Message
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ingero.echo.auth import ANONYMOUS, Principal, principal
from ingero.echo.decoding import Decoded, DecodePool
from ingero.echo.httpbody import BodyTooLarge, discard_body, read_body
from ingero.echo.rows import CLUSTER_ID
from ingero.echo.store import Store
from ingero.otlp.receiver import (
    GRPC_NO_REUSEPORT,
    UNSUPPORTED_MEDIA_TYPE,
    Reply,
    RequestError,
    abort,
    bind_grpc,
    error_reply,
    export_response,
    grpc_handlers,
    inflate,
    media_type,
    peer_host,
    refusal_error,
    reply_media,
    success_reply,
    too_large,
)
from ingero.otlp.transport import PROTOBUF, Signal
from ingero.runtime.errors import UnavailableError
from ingero.security.access import Gate, Refusal
from ingero.security.scope import ClusterScope

log = logging.getLogger(__name__)

# How long a receiver waits for the commit before telling the sender to retry.
COMMIT_TIMEOUT = 30.0
REALM = "ingero-echo"
# Echo has always counted a refused Content-Type under this name (ingest.rejected).
_REASONS = {UNSUPPORTED_MEDIA_TYPE: "bad_content_type"}


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
        gate: Gate[ClusterScope] | None = None,
        decoder: DecodePool | None = None,
    ) -> None:
        self.store = store
        self.max_request_bytes = max_request_bytes
        self.max_events = max_events
        self.gate = gate
        self.decoder = decoder or DecodePool(0)
        self.stats = IngestStats()

    def authorize(self, listener: str, authorization: str | None, source: str) -> Principal:
        """The sender's principal; with tokens configured (and a gate), writing needs one
        too, within its rate limit."""
        if self.gate is None:
            return ANONYMOUS
        admitted = self.gate.admit(
            listener, authorization, source, "a valid bearer token is required"
        )
        if isinstance(admitted, Refusal):
            raise refusal_error(admitted, "unauthenticated")
        return principal(admitted)

    def accept(self, decoded: Decoded, principal: Principal) -> concurrent.futures.Future[int]:
        """Queue decoded records for the store once the principal may write every cluster
        in them; the future resolves once they are committed."""
        clusters = {row[CLUSTER_ID] for row in decoded.rows}
        clusters.update(p.cluster_id for p in decoded.scores)
        outside = sorted(c for c in clusters if not principal.allows(c))
        if outside:
            raise RequestError(
                403,
                "forbidden_cluster",
                f"this token may not write cluster {outside[0]!r}; nothing stored",
            )
        self.stats.count(events=len(decoded.rows), scores=len(decoded.scores))
        return self.store.submit(rows=decoded.rows, scores=decoded.scores)

    def _refused(self, exc: Exception) -> RequestError:
        """Count a refused request; the refusal to answer, a new error without ``exc``'s
        traceback: kept in the handler's frame, ``exc`` would hold a reference cycle through
        it, and with it the request's body and message until the cycle collector ran."""
        if isinstance(exc, RequestError):
            self.stats.reject(_REASONS.get(exc.reason, exc.reason))
            return RequestError(exc.status, exc.reason, str(exc), exc.retry_after)
        # not stored (a decoding worker died, the commit failed or timed out): not counted
        return RequestError(503, "unavailable", f"not stored, retry: {exc or 'commit timed out'}")

    # -- OTLP/HTTP ---------------------------------------------------------------------------

    def http_app(self) -> Starlette:
        async def http_error(request: Request, exc: Exception) -> Response:
            assert isinstance(exc, HTTPException)
            response = _response(
                error_reply(exc.status_code, str(exc.detail), _reply_media(request), REALM)
            )
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

    async def _http(self, request: Request, kind: Signal) -> Response:
        media = _reply_media(request)
        body_read = False  # a refusal past this point has read (or dropped) the body
        try:
            source = request.client.host if request.client else ""
            principal = self.authorize("otlp-http", request.headers.get("authorization"), source)
            media = media_type(request.headers.get("content-type"))
            try:
                body = await read_body(request, self.max_request_bytes)
            except BodyTooLarge:
                raise too_large(self.max_request_bytes) from None
            finally:
                body_read = True
            encoding = request.headers.get("content-encoding")
            if encoding is not None:
                # zlib lets go of the GIL while it inflates: a thread keeps the loop free
                body = await asyncio.to_thread(inflate, body, encoding, self.max_request_bytes)
            records = await self._decode(body, media, kind)
            future = self.accept(records, principal)
            await asyncio.wait_for(asyncio.wrap_future(future), COMMIT_TIMEOUT)
        except (RequestError, UnavailableError, TimeoutError) as exc:
            refusal = self._refused(exc)
            if not body_read:
                # refused before its body was read (401, 415, 429): drop it, or the
                # sender may see a reset instead of the refusal
                await discard_body(request)
            return _response(
                error_reply(refusal.status, str(refusal), media, REALM, refusal.retry_after)
            )
        return _response(success_reply(export_response(kind), media))

    async def _decode(self, body: bytes, content_type: str, kind: Signal) -> Decoded:
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
            options=[
                ("grpc.max_receive_message_length", self.max_request_bytes),
                GRPC_NO_REUSEPORT,
            ],
        )
        server.add_generic_rpc_handlers(
            grpc_handlers({kind: self._grpc_export(kind) for kind in ("logs", "metrics")})
        )
        try:
            port = bind_grpc(server, address, credentials)
        except OSError as exc:
            # one line and EX_UNAVAILABLE, as for the HTTP listeners and as Fleet does
            raise UnavailableError(f"cannot listen for OTLP/gRPC on {address}: {exc}") from None
        server.start()
        return server, port

    def _grpc_export(self, kind: Signal) -> Callable[[bytes, grpc.ServicerContext], Message]:
        def export(body: bytes, context: grpc.ServicerContext) -> Message:
            metadata = dict(context.invocation_metadata() or ())
            try:
                principal = self.authorize(
                    "otlp-grpc", metadata.get("authorization"), peer_host(context.peer())
                )
                now = self.store.clock.now()
                records = self.decoder.decode_sync(body, PROTOBUF, kind, self.max_events, now)
                self.accept(records, principal).result(timeout=COMMIT_TIMEOUT)
            except (RequestError, UnavailableError, concurrent.futures.TimeoutError) as exc:
                abort(context, self._refused(exc))
            return export_response(kind)

        return export


def _reply_media(request: Request) -> str:
    return reply_media(request.headers.get("content-type"))


def _response(reply: Reply) -> Response:
    return Response(
        reply.body, reply.status, headers=dict(reply.headers), media_type=reply.content_type
    )
