"""Each kind of bad input gets a clear refusal, is counted, and leaves the score map intact."""

from __future__ import annotations

import gzip
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)

from ingero.otlp.health import NodePush
from tests.integration.fleet.helpers import Fleet, expected_threshold, start_fleet, wait_for

pytestmark = pytest.mark.integration

GOOD = [NodePush(node_id=f"g{i}", cluster_id="c", score=0.9 - 0.01 * i) for i in range(6)]
MAX_BODY = 64 * 1024


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    daemon = start_fleet(
        tmp_path_factory.mktemp("bad"), {"limits": {"max_nodes": 10, "max_body_bytes": MAX_BODY}}
    )
    try:
        assert daemon.push(GOOD).status == 200
        wait_for(lambda: daemon.threshold("c").status == 200, what="first tick")
        yield daemon  # type: ignore[misc]
    finally:
        daemon.stop()


def intact(fleet: Fleet) -> None:
    """The six good nodes, and only they, define the threshold; the daemon still answers."""
    view = fleet.threshold("c").json()
    assert view["active_nodes"] == 6
    assert view["threshold"] == pytest.approx(expected_threshold(p.score for p in GOOD), abs=1e-12)
    assert fleet.proc is not None and fleet.proc.poll() is None


def status_message(body: bytes) -> str:
    return Status.FromString(body).message


def test_malformed_protobuf(fleet: Fleet) -> None:
    reply = fleet.post_metrics(b"\x0a\xff\xff\xff\xff\x0f", "application/x-protobuf")
    assert reply.status == 400
    assert "malformed protobuf" in status_message(reply.body)
    assert fleet.metric("ingero_fleet_rejected_total", reason="malformed") >= 1
    intact(fleet)


def test_malformed_json(fleet: Fleet) -> None:
    reply = fleet.post_metrics(b'{"resourceMetrics": [', "application/json")
    assert reply.status == 400
    assert "malformed JSON" in reply.json()["message"]
    intact(fleet)


def test_wrong_content_type(fleet: Fleet) -> None:
    reply = fleet.post_metrics(b"score=1", "text/plain")
    assert reply.status == 415
    assert fleet.metric("ingero_fleet_rejected_total", reason="unsupported_media_type") == 1
    assert fleet.metric("ingero_fleet_requests_total", transport="http", code="415") == 1
    intact(fleet)


@pytest.mark.parametrize("score", [float("nan"), float("inf"), -0.5, 1.01])
def test_bad_scores_get_partial_success(fleet: Fleet, score: float) -> None:
    before = fleet.metric("ingero_fleet_rejected_total", reason="bad_score")
    reply = fleet.push([NodePush(node_id="g0", cluster_id="c", score=score), GOOD[1]])
    assert reply.status == 200
    partial = ExportMetricsServiceResponse.FromString(reply.body).partial_success
    assert partial.rejected_data_points == 1
    assert "not in [0, 1]" in partial.error_message
    assert fleet.metric("ingero_fleet_rejected_total", reason="bad_score") == before + 1
    intact(fleet)


def test_missing_node_id(fleet: Fleet) -> None:
    reply = fleet.push([NodePush(node_id="", cluster_id="c", score=0.1)], "json")
    assert reply.status == 200
    partial = reply.json()["partialSuccess"]
    assert partial["rejectedDataPoints"] == "1"
    assert "ingero.node.id" in partial["errorMessage"]
    assert "x-ingero-threshold" not in reply.headers  # nothing accepted, no group to answer for
    intact(fleet)


def test_declared_oversized_body_refused_before_reading(fleet: Fleet) -> None:
    host, _, port = fleet.otlp_http.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        # Only the head is sent: a 50 MB body is announced and never transmitted.
        sock.sendall(
            b"POST /v1/metrics HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            b"Content-Length: 52428800\r\n\r\n"
        )
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b"Connection: close" in answer
    assert fleet.metric("ingero_fleet_rejected_total", reason="too_large") >= 1
    intact(fleet)


@pytest.mark.parametrize("size", [MAX_BODY + 1, 12_000_000])
def test_a_body_over_the_limit_gets_the_413_not_a_connection_reset(fleet: Fleet, size: int) -> None:
    # http.client writes the whole body before it reads the answer: had Fleet closed on
    # the unread rest, the kernel would send a reset and the sender would see "connection
    # reset by peer" instead of the 413
    for _ in range(5):
        reply = fleet.post_metrics(b"\0" * size, "application/x-protobuf", {"Connection": "close"})
        assert reply.status == 413
        assert f"over {MAX_BODY} bytes" in status_message(reply.body)
    intact(fleet)


def test_a_refused_body_never_sent_does_not_hold_the_connection(fleet: Fleet) -> None:
    # a body small enough to be dropped before closing is announced and never sent: the
    # 413 still comes at once, and the connection closes by the discard timeout
    host, _, port = fleet.otlp_http.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/metrics HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            b"Content-Length: 1000000\r\n\r\n"
        )
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 413 ")
        sock.sendall(b"\0" * 1000)  # part of the body: dropped, not parsed as a request
        rest = b""
        while chunk := sock.recv(65536):
            rest += chunk
    assert rest == b""  # closed (by the timeout), and nothing more was answered
    intact(fleet)


def test_gzip_bomb_stops_at_the_limit(fleet: Fleet) -> None:
    bomb = gzip.compress(b"\0" * (20 * MAX_BODY))
    assert len(bomb) < MAX_BODY
    reply = fleet.post_metrics(bomb, "application/x-protobuf", {"Content-Encoding": "gzip"})
    assert reply.status == 413
    assert "decompressed" in status_message(reply.body)
    reply = fleet.post_metrics(b"not gzip", "application/x-protobuf", {"Content-Encoding": "gzip"})
    assert reply.status == 400
    reply = fleet.post_metrics(b"x", "application/x-protobuf", {"Content-Encoding": "br"})
    assert reply.status == 415
    intact(fleet)


def test_expect_100_continue(fleet: Fleet) -> None:
    from tests.integration.fleet.helpers import health_request

    body = health_request(GOOD[:1]).SerializeToString()
    host, _, port = fleet.otlp_http.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/metrics HTTP/1.1\r\nContent-Type: application/x-protobuf\r\n"
            b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body)
        )
        assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 OK\r\n")
    intact(fleet)


def test_pipelined_requests_each_get_a_reply(fleet: Fleet) -> None:
    from tests.integration.fleet.helpers import health_request

    body = health_request(GOOD[:1]).SerializeToString()
    one = (
        b"POST /v1/metrics HTTP/1.1\r\nContent-Type: application/x-protobuf\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    ) + body
    host, _, port = fleet.otlp_http.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(one * 3 + b"GET /v1/metrics HTTP/1.1\r\n\r\n")
        answer = b""
        while answer.count(b"HTTP/1.1 ") < 4:
            chunk = sock.recv(65536)
            assert chunk, answer
            answer += chunk
    assert answer.count(b"HTTP/1.1 200 OK") == 3
    assert answer.count(b"X-Ingero-Threshold: ") == 3
    assert b"HTTP/1.1 405 " in answer
    intact(fleet)


def test_chunked_and_garbage_requests(fleet: Fleet) -> None:
    host, _, port = fleet.otlp_http.rpartition(":")
    for raw, status in (
        (b"POST /v1/metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", b"411"),
        (b"\x16\x03\x01 garbage\r\n\r\n", b"400"),
        (b"GET /v1/metrics HTTP/1.1\r\n\r\n", b"405"),
        (b"POST /nope HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"404"),
    ):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(raw)
            assert sock.recv(65536).split(b" ")[1] == status, raw
    intact(fleet)


def test_flood_of_unknown_nodes_beyond_the_cap(fleet: Fleet) -> None:
    flood = [NodePush(node_id=f"flood{i}", cluster_id="other", score=0.5) for i in range(50)]
    reply = fleet.push(flood)
    partial = ExportMetricsServiceResponse.FromString(reply.body).partial_success
    # max_nodes is 10 and the 6 good nodes are tracked: 4 get in, 46 are refused.
    assert partial.rejected_data_points == 46
    assert "limits.max_nodes" in partial.error_message
    assert fleet.metric("ingero_fleet_rejected_total", reason="capacity") == 46
    # Known nodes still push.
    assert fleet.push(GOOD).status == 200
    intact(fleet)


def export_raw(fleet: Fleet, body: bytes) -> None:
    """MetricsService/Export with ``body`` sent as it is, not a serialised request."""
    with grpc.insecure_channel(fleet.otlp_grpc) as channel:
        export = channel.unary_unary(
            "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
            request_serializer=lambda b: b,
            response_deserializer=ExportMetricsServiceResponse.FromString,
        )
        export(body, timeout=10)


def test_grpc_malformed_message(fleet: Fleet) -> None:
    with pytest.raises(grpc.RpcError) as info:
        export_raw(fleet, b"\x0a\xff\xff\xff\xff\x0f")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed protobuf" in info.value.details()
    assert (
        fleet.metric("ingero_fleet_requests_total", transport="grpc", code="INVALID_ARGUMENT") == 1
    )
    intact(fleet)


def test_grpc_oversized_message(fleet: Fleet) -> None:
    with pytest.raises(grpc.RpcError) as info:
        export_raw(fleet, b"\x0a" + b"\x80\x80\x08" + b"\0" * (2 * MAX_BODY))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    intact(fleet)


def test_api_bad_queries(fleet: Fleet) -> None:
    reply = fleet.request(fleet.api, "GET", "/api/v1/threshold")
    assert reply.status == 400 and "cluster_id" in reply.json()["error"]
    reply = fleet.threshold("nowhere")
    assert reply.status == 404 and reply.json()["error"] == "no such peer group"
    reply = fleet.request(fleet.api, "GET", "/api/v1/threshold?cluster_id=c&&&=")
    assert reply.status == 400
    assert fleet.request(fleet.api, "POST", "/metrics", b"x").status == 405


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("threshold: {k: -1}\n", "threshold.k"),
        ("limits: {max_body_bytes: 0}\n", "limits.max_body_bytes"),
        ("auth: {token_file: /nonexistent/token}\n", "auth.token_file"),
        (
            "auth: {token_file: /a, bearer_token_file: /b}\n",
            "auth.bearer_token_file and auth.token_file are one setting; keep token_file",
        ),
        ("auth: {tls_cert: /nonexistent/c.pem, tls_key: /nonexistent/k.pem}\n", "auth.tls"),
        ("echo: {endpoint: 'http://127.0.0.1:9', token_file: /nonexistent/t}\n", "echo.token_file"),
    ],
)
def test_bad_config_is_one_line_and_exit_78(tmp_path: Path, text: str, key: str) -> None:
    result = run_fleet_cli(tmp_path, text)
    assert result.returncode == 78
    assert result.stderr.count("\n") == 1 and key in result.stderr, result.stderr


def test_the_earlier_token_file_key_is_read_with_a_deprecation_line(tmp_path: Path) -> None:
    """auth.bearer_token_file is auth.token_file's earlier name: a site's file with it is
    read (here its missing token is the error), told once that the key is deprecated."""
    result = run_fleet_cli(tmp_path, "auth: {bearer_token_file: /nonexistent/token}\n")
    assert result.returncode == 78
    deprecation, error = result.stderr.splitlines()
    assert deprecation.endswith(
        "auth.bearer_token_file is deprecated; it is auth.token_file now"
    ), deprecation
    assert "auth.token_file" in error and "/nonexistent/token" in error, error


def run_fleet_cli(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    """``ingero fleet`` on a configuration file of ``text``; it exits on a bad one."""
    from tests.integration.fleet.helpers import ROOT

    config = tmp_path / "fleet.yaml"
    config.write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "ingero.cli.main", "fleet", "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
