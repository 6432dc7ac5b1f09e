"""The dashboard's routes on Echo's API app: pages over Echo's questions, read-only.

Each page asks the questions the API answers (``Service.answer``), for the caller's
principal, so a scoped token sees only its clusters, as on the API. The caller is the
``Authorization: Bearer`` header (curl, a reverse proxy that adds it) or, for a browser,
the cookie the sign-in form sets (HttpOnly, SameSite=Strict, Secure over TLS). A token in
the URL is refused: URLs end up in logs, proxies and browser history.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from ingero.echo.answers import JOB_ACTIVE_S
from ingero.echo.auth import AccessDenied, Principal, principal
from ingero.echo.dashboard import view
from ingero.echo.httpbody import BodyTooLarge, read_body
from ingero.echo.questions import BadRequest
from ingero.echo.service import Service
from ingero.security.access import Gate, Refusal
from ingero.security.scope import ClusterScope

COOKIE = "ingero_token"
LISTENER = "dashboard"
MAX_LOGIN_BODY = 4096
# The only query parameter a page takes: the window, as the questions' ``last``.
PAGE_PARAMS = frozenset({"last"})

# Static files served from the package (no CDN: sites are offline), by name only.
STATIC_TYPES = {
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
    "uPlot.LICENSE": "text/plain; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}

# Scripts only from Echo itself (the chart's data is JSON, never run); the heatmap's cells
# carry their colour in a style attribute.
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self';"
    " style-src-attr 'unsafe-inline'; img-src 'self' data:; form-action 'self';"
    " frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


# What a browser says of a request's origin (Fetch Metadata): only a page of the dashboard
# itself ("same-origin"), or the user's own navigation ("none"), may sign in or out.
SAME_ORIGIN = frozenset({"same-origin", "none"})


def cross_site(request: Request) -> str | None:
    """Why a sign-in or sign-out POST is refused as coming from another site, or None.

    A page on any other origin can post a form here, and SameSite=Strict does not stop it
    where that origin is the same site (another port of the host, a sibling subdomain): it
    signed the victim in with the poster's token (login CSRF) or out. Browsers say where a
    request comes from in ``Sec-Fetch-Site``; one that does not sends ``Origin`` with a
    cross-origin POST, checked against the request's own host. A request with neither is
    no browser's cross-site form (curl, a script holding its own token) and is let through.
    A token bound to the form would not do: a same-site page can set the cookie it is
    compared with (cookies do not keep ports apart)."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return None if site.lower() in SAME_ORIGIN else f"the form came from a {site} page"
    origin = request.headers.get("origin")
    if origin is None:
        return None
    if origin == "null" or urlsplit(origin).netloc != request.headers.get("host", ""):
        return "the form came from another origin"
    return None


class NotFound(Exception):
    """The page names a cluster or a job Echo holds nothing of (for this caller)."""


def html(text: str, status: int = 200) -> Response:
    return Response(
        text, status_code=status, media_type="text/html; charset=utf-8", headers=HEADERS
    )


def dashboard_routes(service: Service, gate: Gate[ClusterScope]) -> list[BaseRoute]:
    """``/dashboard/``: clusters, a cluster's jobs, a job; sign-in and static files."""

    def credentials(request: Request) -> str | None:
        header = request.headers.get("authorization")
        if header is not None:
            return header
        cookie = request.cookies.get(COOKIE)
        return f"Bearer {unquote(cookie)}" if cookie else None

    def source(request: Request) -> str:
        return request.client.host if request.client else ""

    async def ask(name: str, raw: dict[str, Any], caller: Principal) -> dict[str, Any]:
        return await run_in_threadpool(service.answer, name, raw, caller)

    def window(request: Request) -> dict[str, Any]:
        """The page's query parameters as the questions' (only ``last``), or BadRequest."""
        seen: dict[str, str] = {}
        for key, value in request.query_params.multi_items():
            if key in ("token", "access_token"):
                raise BadRequest(
                    "a token in the URL is refused (URLs end up in logs and browser"
                    " history): send Authorization: Bearer, or sign in at /dashboard/login"
                )
            if key not in PAGE_PARAMS:
                raise BadRequest(f"unknown parameter {key!r} (known: last)")
            if key in seen:
                raise BadRequest(f"parameter {key} given more than once")
            seen[key] = value
        return seen

    def guarded(
        handler: Callable[[Request, Principal, bool], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            signed_in = COOKIE in request.cookies
            try:
                args = window(request)  # a token in the URL is refused before it is tried
                admitted = gate.admit(
                    LISTENER, credentials(request), source(request), "sign in first"
                )
                if isinstance(admitted, Refusal):
                    response = html(
                        view.error_page(admitted.status, admitted.message), admitted.status
                    )
                    if admitted.retry_after is not None:
                        response.headers["Retry-After"] = str(max(1, round(admitted.retry_after)))
                    return response
                request.state.args = args
                return await handler(request, principal(admitted), signed_in)
            except BadRequest as exc:
                return html(view.error_page(400, str(exc), signed_in=signed_in), 400)
            except AccessDenied as exc:
                return html(view.error_page(403, str(exc), signed_in=signed_in), 403)
            except NotFound as exc:
                return html(view.error_page(404, str(exc), signed_in=signed_in), 404)

        return endpoint

    async def clusters(request: Request, caller: Principal, signed_in: bool) -> Response:
        args = request.state.args
        summary = await ask("summary", dict(args), caller)
        jobs = await ask("jobs", {**args, "limit": view.MAX_ROWS}, caller)
        return html(view.clusters_page(summary, jobs, signed_in))

    async def cluster(request: Request, caller: Principal, signed_in: bool) -> Response:
        cid = request.path_params["cluster_id"]
        args = {**request.state.args, "cluster_id": cid}
        summary = await ask("summary", args, caller)  # AccessDenied outside the token
        if not summary["clusters"]:
            raise NotFound(f"Echo holds nothing of cluster {cid!r} in this window")
        jobs = await ask("jobs", {**args, "limit": view.MAX_ROWS}, caller)
        stragglers = await ask("stragglers", {**args, "limit": 20}, caller)
        drains = await ask("drains", {**args, "limit": 20}, caller)
        return html(view.cluster_page(cid, summary, jobs, stragglers, drains, signed_in))

    async def job_answers(
        request: Request, caller: Principal
    ) -> tuple[str, dict[str, Any], dict[str, Any]]:
        cid, jid = request.path_params["cluster_id"], request.path_params["job_id"]
        args = {"cluster_id": cid, "job_id": jid}
        timeline = await ask("job_timeline", {**args, **request.state.args}, caller)
        report = await ask("job_report", args, caller)
        if not timeline["found"] and not report["found"]:
            raise NotFound(f"Echo holds nothing of job {jid!r} in cluster {cid!r}")
        return cid, timeline, report

    async def job(request: Request, caller: Principal, signed_in: bool) -> Response:
        cid, timeline, report = await job_answers(request, caller)
        seen = [n["last_seen"] for n in timeline["nodes"] if n["last_seen"] is not None]
        running = bool(seen) and max(seen) >= service.clock.now() - JOB_ACTIVE_S
        return html(view.job_page(cid, timeline, report, running=running, signed_in=signed_in))

    async def trace(request: Request, caller: Principal, signed_in: bool) -> Response:
        cid, timeline, report = await job_answers(request, caller)
        name = f"ingero-{cid}-{timeline['job_id']}.json"
        return Response(
            json.dumps(view.trace_events(timeline, report)),
            media_type="application/json",
            headers={
                **HEADERS,
                "Content-Disposition": f"attachment; filename*=UTF-8''{quote(name, safe='')}",
            },
        )

    async def login_page(request: Request) -> Response:
        return html(view.page("Sign in", view.login_form()))

    def refused_cross_site(request: Request, what: str) -> Response | None:
        why = cross_site(request)
        if why is None:
            return None
        return html(view.error_page(403, f"{what} refused: {why}"), 403)

    async def login(request: Request) -> Response:
        if (refused := refused_cross_site(request, "sign-in")) is not None:
            return refused
        try:
            body = await read_body(request, MAX_LOGIN_BODY)
        except BodyTooLarge as exc:
            return html(view.page("Sign in", view.login_form(str(exc))), 413)
        form = parse_qs(body.decode("utf-8", "replace"), max_num_fields=4)
        token = (form.get("token") or [""])[0].strip()
        admitted = gate.admit(LISTENER, f"Bearer {token}", source(request), "unknown token")
        if not token or isinstance(admitted, Refusal):
            status = admitted.status if isinstance(admitted, Refusal) else 401
            return html(view.page("Sign in", view.login_form("that token is not valid")), status)
        response = RedirectResponse("/dashboard/", status_code=303, headers=HEADERS)
        response.set_cookie(
            COOKIE,
            quote(token, safe=""),
            path="/dashboard",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def logout(request: Request) -> Response:
        if (refused := refused_cross_site(request, "sign-out")) is not None:
            return refused
        response = RedirectResponse("/dashboard/login", status_code=303, headers=HEADERS)
        response.delete_cookie(COOKIE, path="/dashboard", httponly=True, samesite="strict")
        return response

    static_dir = resources.files("ingero.echo.dashboard") / "static"
    static_bytes = {name: (static_dir / name).read_bytes() for name in STATIC_TYPES}

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC_TYPES:
            return html(view.error_page(404, f"no static file {name!r}"), 404)
        return Response(
            static_bytes[name],
            media_type=STATIC_TYPES[name],
            headers={"Cache-Control": "max-age=3600", "X-Content-Type-Options": "nosniff"},
        )

    async def root(request: Request) -> Response:
        return RedirectResponse("/dashboard/", status_code=307)

    return [
        Route("/dashboard", root, methods=["GET"]),
        Route("/dashboard/", guarded(clusters), methods=["GET"]),
        Route("/dashboard/login", login_page, methods=["GET"]),
        Route("/dashboard/login", login, methods=["POST"]),
        Route("/dashboard/logout", logout, methods=["POST"]),
        Route("/dashboard/static/{name}", static, methods=["GET"]),
        Route("/dashboard/clusters/{cluster_id}", guarded(cluster), methods=["GET"]),
        Route("/dashboard/clusters/{cluster_id}/jobs/{job_id}", guarded(job), methods=["GET"]),
        Route(
            "/dashboard/clusters/{cluster_id}/jobs/{job_id}/trace.json",
            guarded(trace),
            methods=["GET"],
        ),
    ]
