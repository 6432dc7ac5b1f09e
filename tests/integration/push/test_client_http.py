"""HttpPushClient against a scripted HTTP server playing a misbehaving Fleet.

The real Fleet never sends Retry-After, insane threshold headers or stalls on purpose, so
these answers come from a small loopback server; the well-behaved path is covered against
the real Fleet in test_cluster.py.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from ingero.otlp.health import NodePush, encode_health
from ingero.otlp.threshold import ThresholdView
from ingero.push.client import HttpPushClient
from ingero.push.config import PushConfig
from ingero.runtime.config import Duration

pytestmark = pytest.mark.integration


class Script:
    status = 200
    headers: dict[str, str] = {}  # noqa: RUF012 - replaced per test
    delay = 0.0
    api: object = None
    raw_api: bytes | None = None  # sent as is instead of ``api`` as JSON
    seen: list[tuple[str, str, bytes]] = []  # noqa: RUF012
    clusters: list[str] = []  # noqa: RUF012 - the X-Ingero-Cluster-Id of each POST


Served = tuple[ThreadingHTTPServer, type[Script]]


@pytest.fixture
def server() -> Iterator[Served]:
    yield from serve()


@pytest.fixture
def second() -> Iterator[Served]:
    """Another scripted Fleet (a second endpoint)."""
    yield from serve()


def serve() -> Iterator[Served]:
    script = type("S", (Script,), {"headers": {}, "seen": [], "clusters": []})

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, status: int, headers: dict[str, str], body: bytes) -> None:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            script.seen.append((self.path, self.headers.get("Authorization", ""), body))
            script.clusters.append(self.headers.get("X-Ingero-Cluster-Id", ""))
            time.sleep(script.delay)
            self._reply(script.status, script.headers, b"")

        def do_GET(self) -> None:
            script.seen.append((self.path, self.headers.get("Authorization", ""), b""))
            body = script.raw_api or json.dumps(script.api).encode()
            self._reply(200, {"Content-Type": "application/json"}, body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv, script
    finally:
        srv.shutdown()
        srv.server_close()


def client(srv: ThreadingHTTPServer, **kw: object) -> HttpPushClient:
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    return HttpPushClient(PushConfig(fleet_endpoint=base, api_endpoint=base, **kw))  # type: ignore[arg-type]


def request() -> ExportMetricsServiceRequest:
    return encode_health(NodePush(node_id="n1", cluster_id="c1", score=0.9), time.time_ns())


def test_threshold_headers_and_token(server: Served, tmp_path: Path) -> None:
    srv, script = server
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    script.headers = {
        "X-Ingero-Threshold": "0.8",
        "X-Ingero-Quorum-Met": "true",
        "X-Ingero-Panic": "false",
    }
    result = client(srv, auth_token_file=str(token)).push(request())
    assert result.ok and result.error is None
    assert result.reading == ThresholdView(threshold=0.8, quorum_met=True, panic=False)
    path, auth, body = script.seen[0]
    assert (path, auth) == ("/v1/metrics", "Bearer s3cret")
    assert ExportMetricsServiceRequest.FromString(body).resource_metrics[0].resource.attributes


@pytest.mark.parametrize(
    ("status", "retry_after", "expected"),
    [(429, "7", 7.0), (503, "120", 120.0), (503, "garbage", None)],
)
def test_retry_after_on_refusal(
    server: Served, status: int, retry_after: str, expected: float | None
) -> None:
    srv, script = server
    script.status, script.headers = status, {"Retry-After": retry_after}
    result = client(srv).push(request())
    assert not result.ok and result.error == f"HTTP {status}"
    assert result.retry_after == expected


def test_retry_after_http_date(server: Served) -> None:
    srv, script = server
    script.status, script.headers = 503, {"Retry-After": formatdate(time.time() + 60, usegmt=True)}
    result = client(srv).push(request())
    assert result.retry_after is not None and 50 < result.retry_after <= 61


def test_insane_threshold_rejected_and_not_polled(server: Served) -> None:
    srv, script = server
    script.headers = {"X-Ingero-Threshold": "inf", "X-Ingero-Quorum-Met": "true"}
    result = client(srv).push(request())
    assert result.ok and result.reading is None
    assert result.error is not None and "rejected" in result.error


def test_a_spoofed_reply_s_unbounded_episode_is_ignored_and_logged_bounded(
    server: Served, caplog: pytest.LogCaptureFixture
) -> None:
    """A reply with a 60,000-character NCCL episode id, type and op: fleet-push took a
    snapshot under that id, logged 110 KB lines and sent 161 KB events Fleet refused. The
    episode is ignored, the reply's threshold kept, and the one warning is short."""
    srv, script = server
    hostile = "f" * 60_000
    script.headers = {
        "X-Ingero-Threshold": "0.8",
        "X-Ingero-Quorum-Met": "true",
        "X-Ingero-Nccl-Episode-Id": hostile,
        "X-Ingero-Nccl-Episode-Type": "x" + hostile,
        "X-Ingero-Nccl-Episode-Since": "1700000000.0",
        "X-Ingero-Nccl-Episode-Op": "op" + hostile,
    }
    caplog.set_level(logging.WARNING, logger="ingero.push.client")
    c = client(srv)
    results = [c.push(request()) for _ in range(3)]
    assert [r.reading for r in results] == [ThresholdView(threshold=0.8, quorum_met=True)] * 3
    assert all(r.ok and r.error is None for r in results)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "ignored" in said[0] and len(said[0]) < 400, said


def test_poll_api_and_reject_insane_answer(server: Served) -> None:
    srv, script = server
    script.api = {"threshold": 0.55, "quorum_met": True, "panic": False}
    c = client(srv)
    assert c.poll_threshold("c1", "42") == ThresholdView(
        threshold=0.55, quorum_met=True, panic=False
    )
    assert script.seen[-1][0] == "/api/v1/threshold?cluster_id=c1&job_id=42"
    script.api = {"threshold": 7, "quorum_met": True}
    assert c.poll_threshold("c1", None) is None
    # nested past the recursion limit: json.loads raised RecursionError, not ValueError
    script.raw_api = b"[" * 100_000 + b"]" * 100_000
    assert c.poll_threshold("c1", None) is None


def test_a_stalled_fleet_costs_one_timeout(server: Served) -> None:
    srv, script = server
    script.delay = 3.0
    result = client(srv, push_interval=Duration(1.0)).push(request())  # timeout: half the interval
    assert not result.ok and result.error is not None and "timed out" in result.error


def test_unreachable_fleet() -> None:
    c = HttpPushClient(PushConfig(fleet_endpoint="http://127.0.0.1:1"))
    result = c.push(request())
    assert not result.ok and result.error


def test_a_failing_fleet_hands_over_to_the_next_endpoint(server: Served, second: Served) -> None:
    (one, first), (two, other) = server, second
    urls = [f"http://127.0.0.1:{srv.server_address[1]}" for srv in (one, two)]
    push = HttpPushClient(PushConfig(fleet_endpoint=urls, cluster_id="c1"))
    first.status = 503
    assert push.push(request()).ok  # the 503 is retried on the second, within the push
    assert (len(first.seen), len(other.seen)) == (1, 1)
    first.status = 200
    assert push.push(request()).ok  # sticky: the second works, so it stays there
    assert (len(first.seen), len(other.seen)) == (1, 2)
    other.status = 400  # a refusal is the same on every replica: no failover
    result = push.push(request())
    assert not result.ok and result.error == "HTTP 400"
    assert (len(first.seen), len(other.seen)) == (1, 3)
    assert set(first.clusters + other.clusters) == {"c1"}  # the balancer's hash key
    other.status = 500  # both failing now: the first is in back-off, not tried again yet
    result = push.push(request())
    assert not result.ok and result.error == "HTTP 500"
    assert (len(first.seen), len(other.seen)) == (1, 4)
