"""The dashboard's pages on a real ``ingero echo``: what they show, to whom (a scoped token
sees only its clusters, as on the API), the sign-in cookie, and bad input answered with a
clear page while the daemon keeps serving."""

from __future__ import annotations

import html
import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from ingero.otlp.health import NodePush, encode_health
from ingero.otlp.logs import encode_events
from tests.integration.security import make_cert

from .helpers import TOKEN_A, TOKEN_B, TOKEN_OPS, EchoProcess, http, straggler

pytestmark = pytest.mark.integration

PROTOBUF = "application/x-protobuf"


@pytest.fixture(scope="module", autouse=True)
def seeded(echo: EchoProcess) -> None:
    # within the pages' default window (the last 7 days)
    t0 = time.time() - 3600.0
    events = [
        replace(straggler("a-slow", "A", t0, job="7"), rank=3),
        replace(straggler("a-slow", "A", t0 + 200, job="7"), rank=3),
        straggler("a-slow", "A", t0 + 300, job="7", kind="node_drained", reason="ingero: 0.5"),
        replace(straggler("b-<slow>", "B", t0, job="9"), rank=0),
    ]
    status, body = http(
        "POST",
        f"http://{echo.otlp_http}/v1/logs",
        encode_events(events).SerializeToString(),
        TOKEN_OPS,
        PROTOBUF,
    )
    assert status == 200, body
    request = ExportMetricsServiceRequest()
    for minute in range(5):
        for i, node in enumerate(["a-slow", "a-ok1", "a-ok2"]):
            push = NodePush(node, "A", 0.4 if i == 0 else 0.9, job_id="7", rank=3 + i)
            part = encode_health(push, int((t0 + 60 * minute) * 1e9))
            request.resource_metrics.extend(part.resource_metrics)
    url = f"http://{echo.otlp_http}/v1/metrics"
    status, body = http("POST", url, request.SerializeToString(), TOKEN_OPS, PROTOBUF)
    assert status == 200, body


def get(
    echo: EchoProcess, path: str, token: str | None = TOKEN_OPS, cookie: str | None = None
) -> tuple[int, str, dict[str, str]]:
    request = urllib.request.Request(echo.url + path)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if cookie:
        request.add_header("Cookie", cookie)
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, resp.read().decode(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def post_form(echo: EchoProcess, path: str, fields: dict[str, str]) -> tuple[int, dict[str, str]]:
    opener = urllib.request.build_opener(NoRedirect)
    data = urllib.parse.urlencode(fields).encode()
    try:
        with opener.open(urllib.request.Request(echo.url + path, data=data), timeout=30) as r:
            return r.status, dict(r.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers)


def test_pages_show_clusters_jobs_and_the_straggler(echo: EchoProcess) -> None:
    status, text, headers = get(echo, "/dashboard/")
    assert status == 200, text
    assert 'href="/dashboard/clusters/A"' in text and 'href="/dashboard/clusters/B"' in text
    assert "script-src 'self'" in headers["content-security-policy"]
    status, text, _ = get(echo, "/dashboard/clusters/A")
    assert status == 200, text
    assert 'href="/dashboard/clusters/A/jobs/7"' in text and "a-slow" in text
    status, text, _ = get(echo, "/dashboard/clusters/A/jobs/7")
    assert status == 200, text
    chain = text.split('<ol class="chain">')[1].split("</ol>")[0]
    assert '<b class="node">a-slow</b>' in chain and "(rank 3)" in chain and "fix hint" in chain
    assert 'id="scores-data"' in text and '<svg class="timeline"' in text
    # every node of the job is in its table, the straggler first
    nodes = text.split('<table class="nodes">')[1].split("</table>")[0]
    assert nodes.index("a-slow") < nodes.index("a-ok1") and "a-ok2" in nodes
    # the other cluster's node is not on A's pages; B's odd node id is escaped on B's
    assert "b-&lt;slow" not in text
    status, text, _ = get(echo, "/dashboard/clusters/B")
    assert "b-&lt;slow&gt;" in text and "b-<slow>" not in text


def test_trace_download_holds_the_episode_and_the_drain(echo: EchoProcess) -> None:
    status, text, headers = get(echo, "/dashboard/clusters/A/jobs/7/trace.json")
    assert status == 200 and headers["content-type"] == "application/json"
    assert "attachment" in headers["content-disposition"]
    events = json.loads(text)["traceEvents"]
    names = {e["name"] for e in events}
    assert {"straggler", "node_drained", "process_name"} <= names


def test_a_scoped_token_sees_only_its_clusters(echo: EchoProcess) -> None:
    status, text, _ = get(echo, "/dashboard/", token=TOKEN_A)
    assert status == 200
    assert "/dashboard/clusters/A" in text and "/dashboard/clusters/B" not in text
    for path in ("/dashboard/clusters/B", "/dashboard/clusters/B/jobs/9"):
        status, text, _ = get(echo, path, token=TOKEN_A)
        assert status == 403, text
        assert "no access to cluster 'B'" in html.unescape(text) and "b-&lt;slow&gt;" not in text
    status, text, _ = get(echo, "/dashboard/clusters/A/jobs/7", token=TOKEN_B)
    assert status == 403 and "a-slow" not in text


@pytest.mark.parametrize(
    ("path", "status", "said"),
    [
        ("/dashboard/clusters/A/jobs/404", 404, "nothing of job '404'"),
        ("/dashboard/clusters/nowhere", 404, "nothing of cluster 'nowhere'"),
        ("/dashboard/clusters/A?last=banana", 400, "parameter last must look like"),
        ("/dashboard/clusters/A?last=1h&last=2h", 400, "given more than once"),
        ("/dashboard/?limit=5", 400, "unknown parameter 'limit'"),
        (f"/dashboard/?token={TOKEN_OPS}", 400, "a token in the URL is refused"),
        ("/dashboard/static/../../etc/passwd", 404, ""),
        ("/dashboard/static/secret.js", 404, "no static file"),
    ],
)
def test_bad_input_gets_a_clear_page(echo: EchoProcess, path: str, status: int, said: str) -> None:
    got, text, headers = get(echo, path)
    assert got == status, text
    assert said in html.unescape(text)
    if said:
        assert headers["content-type"].startswith("text/html")
    assert http("GET", f"{echo.url}/healthz")[0] == 200  # still serving


def test_without_a_token_the_page_asks_to_sign_in_and_the_cookie_works(
    echo: EchoProcess,
) -> None:
    status, text, _ = get(echo, "/dashboard/clusters/A", token=None)
    assert status == 401 and 'action="/dashboard/login"' in text
    status, _ = post_form(echo, "/dashboard/login", {"token": "not-a-token-0123456789"})
    assert status == 401
    status, headers = post_form(echo, "/dashboard/login", {"token": TOKEN_A})
    assert status == 303 and headers["location"] == "/dashboard/"
    cookie = headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/dashboard" in cookie
    assert "Secure" not in cookie  # plain HTTP here; over TLS the cookie is Secure
    jar = cookie.split(";")[0]
    status, text, _ = get(echo, "/dashboard/", token=None, cookie=jar)
    assert status == 200 and "/dashboard/clusters/B" not in text and "sign out" in text
    status, text, _ = get(echo, "/dashboard/clusters/B", token=None, cookie=jar)
    assert status == 403
    status, headers = post_form(echo, "/dashboard/logout", {})
    assert status == 303 and 'ingero_token=""' in headers["set-cookie"]


def test_static_files_are_served_from_the_package(echo: EchoProcess) -> None:
    status, text, headers = get(echo, "/dashboard/static/uPlot.iife.min.js", token=None)
    assert status == 200 and headers["content-type"].startswith("text/javascript")
    assert text.startswith("/*! https://github.com/leeoniya/uPlot (v1.6.31) */")
    status, text, _ = get(echo, "/dashboard/static/uPlot.LICENSE", token=None)
    assert status == 200 and "MIT" in text


def test_over_tls_the_sign_in_cookie_is_secure(tmp_path: Path) -> None:
    cert, key = make_cert(tmp_path)
    echo = EchoProcess(tmp_path, tls=(cert, key)).start()
    try:
        context = ssl.create_default_context(cafile=str(cert))
        opener = urllib.request.build_opener(
            NoRedirect, urllib.request.HTTPSHandler(context=context)
        )
        data = urllib.parse.urlencode({"token": TOKEN_A}).encode()
        with pytest.raises(urllib.error.HTTPError) as got:  # the 303, not followed
            opener.open(
                urllib.request.Request(echo.url + "/dashboard/login", data=data), timeout=30
            )
        assert got.value.code == 303
        cookie = got.value.headers["set-cookie"]
        assert "Secure" in cookie and "HttpOnly" in cookie
        request = urllib.request.Request(echo.url + "/dashboard/")
        request.add_header("Cookie", cookie.split(";")[0])
        with urllib.request.urlopen(request, context=context, timeout=30) as resp:
            assert resp.status == 200 and "Clusters" in resp.read().decode()
    finally:
        echo.stop()
