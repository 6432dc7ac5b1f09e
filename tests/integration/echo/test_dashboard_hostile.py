"""The dashboard against hostile input in a real headless Chromium, on a real ``ingero
echo``: node ids built to break the page's embedded JSON or the copy-paste shell commands,
and a page on another origin (a second loopback port: the same site, so SameSite=Strict
cookies go along) that auto-posts the sign-in or sign-out form."""

from __future__ import annotations

import http.server as httpserver
import json
import shlex
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from html import unescape
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from ingero.otlp.health import NodePush, encode_health
from ingero.otlp.logs import encode_events

from .browser import CHROMIUM, Loopback, Proxy, chromium
from .cdp import Browser
from .helpers import TOKEN_A, TOKEN_B, TOKEN_OPS, EchoProcess, http, straggler

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        CHROMIUM is None, reason="chromium is not installed (tests/apt-packages.txt)"
    ),
]

PROTOBUF = "application/x-protobuf"
# A node id that opens the "script data double escaped" state inside the JSON block (only
# "</" was escaped, so the rest of the page became script text), and one that runs a
# command in the shell of whoever pastes the page's `ingero explain` line.
SWALLOW = "n-<!--<script>"
INJECT = "n$(touch PWNED)"
NODES = [SWALLOW, INJECT, "n-ok"]


@pytest.fixture(scope="module", autouse=True)
def seeded(echo: EchoProcess) -> None:
    t0 = time.time() - 3600.0
    events = [replace(straggler(n, "A", t0 + i, job="7"), rank=i) for i, n in enumerate(NODES[:2])]
    status, body = http("POST", f"http://{echo.otlp_http}/v1/logs",
                        encode_events(events).SerializeToString(), TOKEN_OPS, PROTOBUF)  # fmt: skip
    assert status == 200, body
    request = ExportMetricsServiceRequest()
    for minute in range(5):
        for i, node in enumerate(NODES):
            push = NodePush(node, "A", 0.4 if i < 2 else 0.9, job_id="7", rank=i)
            request.resource_metrics.extend(
                encode_health(push, int((t0 + 60 * minute) * 1e9)).resource_metrics
            )
    status, body = http("POST", f"http://{echo.otlp_http}/v1/metrics",
                        request.SerializeToString(), TOKEN_OPS, PROTOBUF)  # fmt: skip
    assert status == 200, body


@pytest.fixture
def ops(echo: EchoProcess) -> Iterator[Proxy]:
    proxy = Proxy(echo.url, TOKEN_OPS)
    try:
        yield proxy
    finally:
        proxy.close()


def test_a_node_id_cannot_swallow_the_rest_of_the_job_page(ops: Proxy, tmp_path: Path) -> None:
    dom = chromium(tmp_path, ops.url + "/dashboard/clusters/A/jobs/7")
    # everything after the chart's JSON block is there, drawn
    scores = dom.split('id="scores"')[1].split('id="scores-data"')[0]
    assert 'class="uplot' in scores and "<canvas" in scores  # the block parsed
    nodes = dom.split('<table class="nodes">')[1].split("</table>")[0]
    for node in NODES:
        assert f"<td>{node.replace('<', '&lt;').replace('>', '&gt;')}</td>" in nodes
    for heading in ("Episodes and drains", "Stack snapshots", "Drains", "Perfetto"):
        assert f"<h2>{heading}</h2>" in dom


def test_a_pasted_command_runs_ingero_with_the_ids_as_words(ops: Proxy, tmp_path: Path) -> None:
    """Paste each `ingero ...` line of the page into a real shell, with an `ingero` on its
    PATH that prints the words it got: the ids arrive whole and nothing else runs."""
    dom = chromium(tmp_path, ops.url + "/dashboard/clusters/A/jobs/7")
    lines = [unescape(p.split("</code>")[0]) for p in dom.split("<code>")[1:]]
    lines = [line for line in lines if line.startswith("ingero ")]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "ingero"
    fake.write_text("#!/usr/bin/python3\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    got = []
    for line in lines:
        done = subprocess.run(["bash", "-c", line], cwd=tmp_path, capture_output=True,
                              text=True, timeout=30, check=False,
                              env={"PATH": f"{bin_dir}:/usr/bin:/bin"})  # fmt: skip
        got.append(json.loads(done.stdout) if done.returncode == 0 else done.stderr)
    assert not (tmp_path / "PWNED").exists(), "a pasted command ran the id's $(touch PWNED)"
    assert ["explain", "--nodes", INJECT, "--job", "7"] in got
    assert ["explain", "--nodes", SWALLOW, "--job", "7"] in got
    assert ["export", "--job-nodes", "7"] in got
    assert all(shlex.split(line)[1:] in got for line in lines)


class Attacker(Loopback):
    """Another origin (a second loopback port) whose page auto-posts a dashboard form."""

    def __init__(self, page: str) -> None:
        self.page = page.encode()
        super().__init__(AttackerHandler)


class AttackerHandler(httpserver.BaseHTTPRequestHandler):
    server: Attacker

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(self.server.page)))
        self.end_headers()
        self.wfile.write(self.server.page)

    def log_message(self, format: str, *args: object) -> None:
        pass


def auto_post(action: str, fields: dict[str, str]) -> str:
    inputs = "".join(f'<input name="{k}" value="{v}">' for k, v in fields.items())
    return (f'<form id="f" method="post" action="{action}">{inputs}</form>'
            "<script>document.getElementById('f').submit()</script>")  # fmt: skip


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    b = Browser(tmp_path / "profile")
    try:
        yield b
    finally:
        b.close()


def test_another_origin_cannot_sign_the_victim_in_as_the_attacker(
    echo: EchoProcess, browser: Browser
) -> None:
    """Login CSRF: the victim's browser would then show the attacker's tenant (fake
    stragglers, fake fix hints) as the victim's own."""
    attacker = Attacker(auto_post(f"{echo.url}/dashboard/login", {"token": TOKEN_B}))
    try:
        # refused: the POST's own answer; let through: its redirect to the clusters
        page = browser.goto(attacker.url + "/", lands_on=lambda href: href.startswith(echo.url))
    finally:
        attacker.close()
    assert "ingero_token" not in browser.cookies()
    assert 'data-status="403"' in page and "sign-in refused" in page
    assert "/dashboard/clusters/B" not in page


def test_another_origin_cannot_sign_the_victim_out_and_same_origin_still_can(
    echo: EchoProcess, browser: Browser
) -> None:
    # the victim signs in on the dashboard's own form
    browser.goto(f"{echo.url}/dashboard/login", lands_on=f"{echo.url}/dashboard/login")
    browser.evaluate(
        f"document.querySelector('input[name=token]').value = {json.dumps(TOKEN_A)};"
        " document.querySelector('form').submit()"
    )
    page = browser.wait_for(f"{echo.url}/dashboard/")
    assert 'href="/dashboard/clusters/A"' in page
    assert browser.cookies().get("ingero_token") == TOKEN_A, page
    attacker = Attacker(auto_post(f"{echo.url}/dashboard/logout", {}))
    try:
        page = browser.goto(attacker.url + "/", lands_on=f"{echo.url}/dashboard/logout")
    finally:
        attacker.close()
    assert browser.cookies().get("ingero_token") == TOKEN_A
    assert "sign-out refused" in page
    # the dashboard's own sign-out button still signs out
    browser.goto(f"{echo.url}/dashboard/", lands_on=f"{echo.url}/dashboard/")
    browser.evaluate("document.querySelector('form.logout').submit()")
    browser.wait_for(f"{echo.url}/dashboard/login")
    assert "ingero_token" not in browser.cookies()
