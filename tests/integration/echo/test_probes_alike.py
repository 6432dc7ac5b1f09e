"""Fleet and Echo answer their probes and their API errors alike: ``/healthz`` and
``/readyz`` the same status, content type and bytes, an error the same JSON object
``{"error", "status"}`` (``ingero.runtime.probes``), both with tokens configured."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ingero.echo.api import build_app
from ingero.echo.rates import GpuRates
from ingero.echo.service import Service
from ingero.echo.store import Store
from ingero.security.access import Gate
from ingero.security.bearer import Keyring
from ingero.security.ratelimit import RateLimitConfig
from ingero.security.scope import ClusterScope
from tests.integration.fleet.helpers import start_fleet, wait_for

from .helpers import EchoProcess

pytestmark = pytest.mark.integration


def get(url: str, method: str = "GET") -> tuple[int, str, bytes]:
    """(status, content type, body) of a request without a token (nor a body)."""
    request = urllib.request.Request(url, data=b"" if method == "POST" else None, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers.get("content-type", ""), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("content-type", ""), exc.read()


def test_fleet_and_echo_answer_probes_and_errors_alike(tmp_path: Path) -> None:
    (tmp_path / "echo").mkdir()
    (tmp_path / "fleet").mkdir()
    token = tmp_path / "fleet" / "ops"
    token.write_text("fleet-token-0123456789\n")
    echo = EchoProcess(tmp_path / "echo").start()
    fleet = start_fleet(tmp_path / "fleet", {"auth": {"token_file": str(token)}})
    try:
        daemons = {"fleet": f"http://{fleet.api}", "echo": echo.url}
        wait_for(lambda: all(get(u + "/readyz")[0] == 200 for u in daemons.values()), 30)
        for path in ("/healthz", "/readyz"):
            answers = {name: get(url + path) for name, url in daemons.items()}
            assert answers["fleet"] == answers["echo"], path
            status, content_type, body = answers["fleet"]
            assert (status, content_type) == (200, "application/json"), path
            assert json.loads(body) == {"status": "ok"}, path
        # Errors: no token (401), a method the path does not take (405); the messages are
        # each daemon's own.
        for method, path, status in (("GET", "/metrics", 401), ("POST", "/healthz", 405)):
            for name, url in daemons.items():
                got, content_type, body = get(url + path, method)
                assert (got, content_type) == (status, "application/json"), (name, path)
                error = json.loads(body)
                assert set(error) == {"error", "status"}, (name, path, error)
                assert error["status"] == status and error["error"], (name, path, error)
    finally:
        fleet.stop()
        echo.stop()


def test_echo_readyz_follows_its_readiness(tmp_path: Path) -> None:
    """Echo's /readyz is 503 until every listener serves and again once SIGTERM came (the
    daemon's flag), while /healthz stays 200: Echo's real API app, asked over ASGI."""
    store = Store(tmp_path / "e.db")
    try:
        ready = False
        gate: Gate[ClusterScope] = Gate(Keyring([]), None, RateLimitConfig())
        service = Service(store.path, GpuRates("USD", 1.0, {}))
        app = build_app(service, gate, ready=lambda: ready)
        assert asgi_get(app, "/readyz") == (503, b'{"status": "not ready"}\n')
        assert asgi_get(app, "/healthz") == (200, b'{"status": "ok"}\n')
        ready = True
        assert asgi_get(app, "/readyz") == (200, b'{"status": "ok"}\n')
    finally:
        store.close()


def asgi_get(app: object, path: str) -> tuple[int, bytes]:
    """(status, body) of a GET of ``path``, the ASGI app called as uvicorn calls it."""
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    asyncio.run(app(scope, receive, send))  # type: ignore[operator]
    status = sent[0]["status"]
    assert isinstance(status, int)
    return status, b"".join(m.get("body", b"") for m in sent[1:])  # type: ignore[misc]
