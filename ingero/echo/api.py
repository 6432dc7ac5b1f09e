"""HTTP+JSON API under ``/api/v1/``, its OpenAPI 3.1 document, and the MCP endpoint.

Every question is a GET with query parameters (``POST /api/v1/sql`` takes a JSON body);
every error is JSON ``{"error", "status"}``, as Fleet's. ``/api/v1/openapi.json`` and the
probes ``/healthz`` and ``/readyz`` (answered as Fleet's, ``ingero.runtime.probes``) need no
token; everything else needs a bearer token when a token table is configured.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ingero import __version__
from ingero.echo.answers import QUESTIONS
from ingero.echo.auth import AccessDenied, Principal, principal
from ingero.echo.dashboard.routes import dashboard_routes
from ingero.echo.httpbody import BodyTooLarge, read_body
from ingero.echo.jsontext import encode_answer
from ingero.echo.questions import BadRequest
from ingero.echo.service import SQL_PARAM, SQL_QUESTION, SQL_SUMMARY, Service
from ingero.echo.sql import SqlError
from ingero.otlp.receiver import retry_after_value
from ingero.otlp.values import load_json
from ingero.runtime.buildinfo import daemon_registry
from ingero.runtime.probes import CONTENT_TYPE, HEALTHZ, READYZ, error_body, probe_answer
from ingero.security.access import Gate, Refusal
from ingero.security.scope import ClusterScope

log = logging.getLogger(__name__)

PREFIX = "/api/v1"
MAX_SQL_BODY = 64 * 1024


class JsonAnswer(JSONResponse):
    """A JSON answer that always encodes (``ingero.echo.jsontext``)."""

    def render(self, content: Any) -> bytes:
        return encode_answer(content)


def error(status: int, message: str, retry_after: float | None = None) -> JSONResponse:
    headers = {"WWW-Authenticate": 'Bearer realm="ingero-echo"'} if status == 401 else {}
    if retry_after is not None:
        headers["Retry-After"] = retry_after_value(retry_after)
    return JSONResponse(error_body(status, message), status_code=status, headers=headers)


def admit(gate: Gate[ClusterScope], listener: str, request: Request) -> Principal | JSONResponse:
    """The caller's principal, or the refusal (401, or 429 with Retry-After) to answer."""
    source = request.client.host if request.client else ""
    admitted = gate.admit(
        listener,
        request.headers.get("authorization"),
        source,
        "a valid bearer token is required",
    )
    if isinstance(admitted, Refusal):
        return error(admitted.status, admitted.message, admitted.retry_after)
    return principal(admitted)


class RequireToken:
    """ASGI wrapper: answers 401 (JSON) unless the request carries a valid bearer token."""

    def __init__(self, app: ASGIApp, gate: Gate[ClusterScope]) -> None:
        self.app = app
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            admitted = admit(self.gate, "mcp", Request(scope))
            if isinstance(admitted, Response):
                await admitted(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(
    service: Service,
    gate: Gate[ClusterScope],
    mcp_routes: list[BaseRoute] | None = None,
    mcp_lifespan: Callable[[], Any] | None = None,
    ready: Callable[[], bool] = lambda: True,
) -> Starlette:
    """The API app; ``mcp_routes`` (streamable HTTP MCP) are mounted behind the token check.
    ``ready`` answers ``/readyz``: every listener serving, and not stopping."""

    def guarded(handler: Callable[[Request, Principal], Awaitable[Response]]) -> Any:
        async def endpoint(request: Request) -> Response:
            caller = admit(gate, "api", request)
            if isinstance(caller, Response):
                return caller
            try:
                return await handler(request, caller)
            except BadRequest as exc:
                return error(400, str(exc))
            except SqlError as exc:
                return error(400, str(exc))
            except AccessDenied as exc:
                return error(403, str(exc))

        return endpoint

    def question_endpoint(name: str) -> Any:
        async def handler(request: Request, principal: Principal) -> Response:
            raw: dict[str, Any] = {}
            for key, value in request.query_params.multi_items():
                if key in raw:
                    raise BadRequest(f"parameter {key} given more than once")
                raw[key] = value
            result = await run_in_threadpool(service.answer, name, raw, principal)
            return JsonAnswer(result)

        return guarded(handler)

    async def sql_handler(request: Request, principal: Principal) -> Response:
        try:
            body = await read_body(request, MAX_SQL_BODY)
        except BodyTooLarge as exc:
            return error(413, str(exc))
        try:
            payload = load_json(body)  # nested past the recursion limit too: a ValueError
        except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError among them
            raise BadRequest(f"the body must be JSON: {exc}") from None
        if not isinstance(payload, dict):
            raise BadRequest('the body must be a JSON object like {"query": "SELECT 1"}')
        result = await run_in_threadpool(service.answer, SQL_QUESTION, payload, principal)
        return JsonAnswer(result)

    async def status_handler(request: Request, principal: Principal) -> Response:
        if principal.clusters is not None:
            raise AccessDenied("status covers every cluster; it needs an unscoped token")
        return JSONResponse({"version": __version__, **service.status()})

    async def metrics_handler(request: Request, principal: Principal) -> Response:
        if principal.clusters is not None:
            raise AccessDenied("metrics cover every cluster; they need an unscoped token")
        return Response(prometheus_text(service.status()), media_type=CONTENT_TYPE_LATEST)

    openapi = openapi_document()

    async def openapi_endpoint(request: Request) -> Response:
        return JSONResponse(openapi)

    def probe(is_ready: Callable[[], bool]) -> Any:
        async def endpoint(request: Request) -> Response:
            status, body = probe_answer(is_ready())
            return Response(body, status_code=status, media_type=CONTENT_TYPE)

        return endpoint

    routes: list[BaseRoute] = [
        Route(f"{PREFIX}/openapi.json", openapi_endpoint, methods=["GET"]),
        Route(HEALTHZ, probe(lambda: True), methods=["GET"]),
        Route(READYZ, probe(ready), methods=["GET"]),
        Route(f"{PREFIX}/status", guarded(status_handler), methods=["GET"]),
        Route("/metrics", guarded(metrics_handler), methods=["GET"]),
        Route(f"{PREFIX}/sql", guarded(sql_handler), methods=["POST"]),
    ]
    routes += [
        Route(f"{PREFIX}/{name}", question_endpoint(name), methods=["GET"]) for name in QUESTIONS
    ]
    routes += dashboard_routes(service, gate)
    for route in mcp_routes or []:
        if isinstance(route, Route):
            routes.append(Route(route.path, RequireToken(route.app, gate), methods=route.methods))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        response = error(exc.status_code, str(exc.detail))
        response.headers.update(exc.headers or {})
        return response

    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("internal error on %s", request.url.path)
        return error(500, f"internal error: {type(exc).__name__}")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if mcp_lifespan is None:
            yield
            return
        async with mcp_lifespan():
            yield

    return Starlette(
        routes=routes,
        exception_handlers={HTTPException: http_error, Exception: server_error},
        lifespan=lifespan,
    )


_STORE_COUNTERS = {
    "events_stored": "Events stored (new event_ids)",
    "events_duplicate": "Events received again and not stored twice",
    "scores_stored": "Health-score samples kept in the history",
    "commits": "Write transactions committed",
    "commit_errors": "Write transactions that failed (their senders were told to retry)",
    "retention_deleted": "Events deleted by retention",
}


class _StatusCollector(Collector):
    def __init__(self, status: dict[str, Any]) -> None:
        self.status = status

    def collect(self) -> Iterator[CounterMetricFamily]:
        ingest = self.status.get("ingest", {})
        store = self.status.get("store", {})
        for key, help_text in (
            ("requests", "OTLP requests received"),
            ("events_received", "Events in accepted OTLP requests"),
            ("scores_received", "Health-score points in accepted OTLP requests"),
        ):
            yield CounterMetricFamily(
                f"ingero_echo_ingest_{key}", help_text, value=ingest.get(key, 0)
            )
        rejected = CounterMetricFamily(
            "ingero_echo_ingest_rejected", "OTLP requests refused, by reason", labels=["reason"]
        )
        for reason, count in sorted(ingest.get("rejected", {}).items()):
            rejected.add_metric([reason], count)
        yield rejected
        for key, help_text in _STORE_COUNTERS.items():
            yield CounterMetricFamily(f"ingero_echo_{key}", help_text, value=store.get(key, 0))


def prometheus_text(status: dict[str, Any]) -> bytes:
    """Echo's counters in the Prometheus text format."""
    registry = daemon_registry("echo")
    registry.register(_StatusCollector(status))
    return generate_latest(registry)


def openapi_document() -> dict[str, Any]:
    """OpenAPI 3.1: one operation per question with its input and output schema."""
    err = {"$ref": "#/components/responses/Error"}
    errors = {"400": err, "401": err, "403": err}
    paths: dict[str, Any] = {}
    for q in QUESTIONS.values():
        paths[f"{PREFIX}/{q.name}"] = {
            "get": {
                "operationId": q.name,
                "summary": q.summary,
                "parameters": [
                    {
                        "name": p.name,
                        "in": "query",
                        "required": p.required,
                        "description": p.description,
                        "schema": p.schema(),
                    }
                    for p in q.params
                ],
                "responses": {
                    "200": {
                        "description": q.summary,
                        "content": {"application/json": {"schema": q.output}},
                    },
                    **errors,
                },
            }
        }
    paths[f"{PREFIX}/sql"] = {
        "post": {
            "operationId": "sql",
            "summary": SQL_SUMMARY,
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "properties": {"query": SQL_PARAM.schema()},
                            "required": ["query"],
                            "additionalProperties": False,
                        }
                    }
                },
            },
            "responses": {
                "200": {
                    "description": "Rows of the query",
                    "content": {"application/json": {"schema": Service.sql_output_schema()}},
                },
                "413": err,
                **errors,
            },
        }
    }
    paths[f"{PREFIX}/status"] = {
        "get": {
            "operationId": "status",
            "summary": "Ingest and store counters (unscoped tokens only)",
            "responses": {
                "200": {
                    "description": "Counters",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                },
                **errors,
            },
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "ingero echo",
            "version": __version__,
            "description": "Cluster straggler event store: questions over stored events.",
        },
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "properties": {"error": {"type": "string"}, "status": {"type": "integer"}},
                    "required": ["error", "status"],
                }
            },
            "responses": {
                "Error": {
                    "description": "An error, as JSON",
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                    },
                }
            },
        },
        "security": [{"bearer": []}],
    }
