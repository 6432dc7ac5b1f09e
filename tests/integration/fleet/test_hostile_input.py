"""Hostile input on the real ``ingero fleet``: deeply nested JSON, oversized or trickled
request heads, over-long ids, and the bearer scheme in any case.

Each is refused with a clear status and a counted reason, the daemon keeps serving, and the
memory a refused push leaves behind is bounded by the configuration.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import grpc
import pytest
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)

from ingero.fleet.httpserver import MAX_HEAD_BYTES, MAX_HEADERS
from ingero.otlp.health import NodePush
from ingero.otlp.limits import MAX_EVENT_BYTES, MAX_ID_CHARS, MAX_JSON_DEPTH
from ingero.schema.events import Event
from tests.integration.fleet.helpers import Fleet, health_request, start_fleet, wait_for
from tests.integration.procfs import rss_bytes

pytestmark = pytest.mark.integration

TOKEN = "s3cret-token-for-hostile-tests"
MAX_NODES = 400
MAX_BODY = 2 * 1024 * 1024
HEAD_TIMEOUT = 2.0
GOOD = [NodePush(node_id=f"g{i}", cluster_id="c", score=0.9 - 0.01 * i) for i in range(6)]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("hostile")
    (tmp / "token").write_text(TOKEN + "\n")
    daemon = start_fleet(
        tmp,
        {
            "limits": {
                "max_nodes": MAX_NODES,
                "max_body_bytes": MAX_BODY,
                "head_timeout": f"{HEAD_TIMEOUT}s",
            },
            "auth": {"token_file": str(tmp / "token")},
        },
        token=TOKEN,
    )
    try:
        assert daemon.push(GOOD).status == 200
        wait_for(lambda: daemon.threshold("c").status == 200, what="first tick")
        yield daemon
    finally:
        daemon.stop()


def serving(fleet: Fleet) -> None:
    """The good nodes are still the group, the daemon answers and logged no traceback."""
    assert fleet.proc is not None and fleet.proc.poll() is None
    assert fleet.threshold("c").json()["active_nodes"] == len(GOOD)
    assert "Traceback" not in fleet.log()


def rejected(fleet: Fleet, reason: str) -> float:
    return fleet.metric("ingero_fleet_rejected_total", reason=reason)


def address(listener: str) -> tuple[str, int]:
    host, _, port = listener.rpartition(":")
    return host, int(port)


def exchange(fleet: Fleet, pieces: list[bytes], listener: str | None = None) -> bytes:
    """Send ``pieces`` as separate writes on one connection (a few ms apart, well within
    HEAD_TIMEOUT); everything answered until the server closes it (or 10 s of silence)."""
    with socket.create_connection(address(listener or fleet.otlp_http), timeout=10) as sock:
        for piece in pieces:
            try:
                sock.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break  # the server refused early and closed: its answer is still readable
            time.sleep(0.005)  # separate reads on the server's side
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return answer


def status_of(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:100]
    return int(answer.split(b" ", 2)[1])


# ---- 4. deeply nested JSON -----------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/metrics", "/v1/logs"])
@pytest.mark.parametrize(
    "body",
    [
        # far past the interpreter's recursion limit: json.loads raised RecursionError
        b'{"resourceMetrics":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
        # parses, but one level deeper than the limit
        b'{"resourceLogs":['
        + b'{"a":' * (MAX_JSON_DEPTH - 1)
        + b"1"
        + b"}" * (MAX_JSON_DEPTH - 1)
        + b"]}",
    ],
    ids=["arrays", "objects", "limit+1"],
)
def test_deeply_nested_json_is_400_malformed(fleet: Fleet, path: str, body: bytes) -> None:
    before = rejected(fleet, "malformed")
    reply = fleet.request(fleet.otlp_http, "POST", path, body, {"Content-Type": "application/json"})
    assert reply.status == 400, reply
    assert reply.json()["message"] == f"malformed JSON: nested deeper than {MAX_JSON_DEPTH} levels"
    assert rejected(fleet, "malformed") == before + 1
    serving(fleet)


def test_json_at_the_depth_limit_is_accepted(fleet: Fleet) -> None:
    depth = MAX_JSON_DEPTH - 2  # with the outer object and array: exactly MAX_JSON_DEPTH
    body = b'{"resourceLogs":[' + b'{"a":' * depth + b"1" + b"}" * depth + b"]}"
    reply = fleet.request(
        fleet.otlp_http, "POST", "/v1/logs", body, {"Content-Type": "application/json"}
    )
    assert reply.status == 200, reply.body


# ---- 5. request heads: size, header count, time -----------------------------------------

HEAD = b"POST /v1/metrics HTTP/1.1\r\nHost: fleet\r\nContent-Type: application/x-protobuf\r\n"


def request_with(extra_head: bytes, close: bool = True) -> bytes:
    """A valid push whose head has ``extra_head`` lines: 4 header lines of its own, 5 with
    ``Connection: close``."""
    body = health_request(GOOD[:1]).SerializeToString()
    return (
        HEAD
        + f"Authorization: Bearer {TOKEN}\r\nContent-Length: {len(body)}\r\n".encode()
        + (b"Connection: close\r\n" if close else b"")
        + extra_head
        + b"\r\n"
        + body
    )


def header_lines(count: int, size: int) -> bytes:
    """``count`` distinct header lines of ``size`` bytes each (CRLF included)."""
    return b"".join(b"X-%06d: %s\r\n" % (i, b"v" * (size - 12)) for i in range(count))


@pytest.mark.parametrize(
    ("pieces", "listener"),
    [
        ([HEAD + b"X-Big: " + b"a" * 70_000 + b"\r\n\r\n"], "otlp"),
        ([HEAD + b"X-Big: " + b"a" * 70_000 + b"\r\n\r\n"], "api"),
        # a 100 KB head in two writes, the first within the limit
        ([HEAD + header_lines(1_000, 30), header_lines(2_400, 30) + b"\r\n"], "otlp"),
        # 20,000 headers in 120 KB
        ([HEAD + b"h:v1\r\n" * 20_000 + b"\r\n"], "otlp"),
        # few bytes, too many header lines
        ([HEAD + header_lines(MAX_HEADERS + 1, 14) + b"\r\n"], "otlp"),
        # the same trickled in 1 KB writes
        [[(HEAD + header_lines(3_000, 30) + b"\r\n")[i : i + 1024] for i in range(0, 93_000, 1024)],
         "otlp"],
    ],
    ids=["70KB-header", "70KB-header-api", "100KB-in-two-writes", "20000-headers",
         "too-many-headers", "90KB-in-1KB-writes"],
)  # fmt: skip
def test_oversized_heads_get_431_and_are_counted(
    fleet: Fleet, pieces: list[bytes], listener: str
) -> None:
    before = rejected(fleet, "http_431")
    answer = exchange(fleet, pieces, fleet.api if listener == "api" else fleet.otlp_http)
    assert status_of(answer) == 431
    assert b"Connection: close" in answer
    assert rejected(fleet, "http_431") == before + 1
    serving(fleet)


def test_heads_within_the_limits_are_served(fleet: Fleet) -> None:
    head = len(request_with(b"").split(b"\r\n\r\n")[0])
    for extra in (
        header_lines(MAX_HEADERS - 5, 14),  # MAX_HEADERS lines with request_with's 5
        b"X-Big: " + b"a" * (MAX_HEAD_BYTES - head - 20) + b"\r\n",  # just under the size
    ):
        assert status_of(exchange(fleet, [request_with(extra)])) == 200


def test_a_trickled_head_is_closed_after_head_timeout(fleet: Fleet) -> None:
    before = rejected(fleet, "http_408")
    # 1 byte every 0.1 s for up to a minute: the idle timeout (120 s) would never fire.
    trickle = HEAD + b"X-Slow: " + b"s" * 600
    answer = b""
    closed = False
    with socket.create_connection(address(fleet.otlp_http), timeout=10) as sock:
        sock.settimeout(0.1)
        for byte in trickle:
            try:
                sock.sendall(bytes([byte]))
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            answer += chunk
            if not chunk:
                closed = True
                break
    assert closed, "the connection trickling its head was never closed"
    assert status_of(answer) == 408
    assert rejected(fleet, "http_408") == before + 1
    serving(fleet)


def test_an_idle_keep_alive_connection_is_not_a_slow_head(fleet: Fleet) -> None:
    with socket.create_connection(address(fleet.otlp_http), timeout=10) as sock:
        sock.sendall(request_with(b"", close=False))
        assert status_of(sock.recv(65536)) == 200
        time.sleep(1.5 * HEAD_TIMEOUT)  # between requests the connection is only idle
        sock.sendall(request_with(b"", close=False))
        assert status_of(sock.recv(65536)) == 200


# ---- 6. every string Fleet keeps is bounded --------------------------------------------

FIELDS = ["node_id", "cluster_id", "job_id", "host_name", "gpu_model", "provider",
          "workload_type", "dominant_signal"]  # fmt: skip


@pytest.mark.parametrize("field", FIELDS)
def test_each_kept_string_over_the_limit_is_refused_too_long(fleet: Fleet, field: str) -> None:
    base = {"node_id": "long-test", "cluster_id": "other", "score": 0.5}
    at_limit = NodePush(**{**base, field: "x" * MAX_ID_CHARS})  # type: ignore[arg-type]
    over = NodePush(**{**base, field: "y" * (MAX_ID_CHARS + 1)})  # type: ignore[arg-type]
    before = rejected(fleet, "too_long")
    reply = fleet.push([at_limit, over])
    assert reply.status == 200
    partial = ExportMetricsServiceResponse.FromString(reply.body).partial_success
    assert partial.rejected_data_points == 1
    assert f"is {MAX_ID_CHARS + 1} characters long, the limit is {MAX_ID_CHARS}" in (
        partial.error_message
    )
    assert "yyyyyyyyyyyyyyyyyyyy" not in partial.error_message  # named, never quoted
    assert rejected(fleet, "too_long") == before + 1


def test_grpc_push_and_logs_over_the_limits_get_partial_success(fleet: Fleet) -> None:
    before = rejected(fleet, "too_long")
    long_id = NodePush(node_id="n" * (MAX_ID_CHARS + 1), cluster_id="other", score=0.5)
    with grpc.insecure_channel(fleet.otlp_grpc) as channel:
        export = channel.unary_unary(
            "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=ExportMetricsServiceResponse.FromString,
        )
        response = export(
            health_request([long_id]),
            timeout=10,
            metadata=(("authorization", f"Bearer {TOKEN}"),),
        )
    assert response.partial_success.rejected_data_points == 1
    events = [
        Event("node_drained", "n" * (MAX_ID_CHARS + 1), "other", 1.0),
        Event("node_drained", "ok", "other", 1.0, extra={"note": "z" * MAX_EVENT_BYTES}),
        Event("node_drained", "ok", "other", 1.0),
    ]
    reply = fleet.post_logs(events)
    partial = ExportLogsServiceResponse.FromString(reply.body).partial_success
    assert reply.status == 200 and partial.rejected_log_records == 2
    assert f"the limit is {MAX_EVENT_BYTES}" in partial.error_message
    assert rejected(fleet, "too_long") == before + 3
    serving(fleet)


# What Fleet keeps per tracked node (ingero/fleet/state.py): 5 strings (node id, host name,
# GPU model, provider, dominant signal) and, per peer group (at most 2 per node), 5 more
# (key, cluster, job, workload type, the published view's key) of at most 2 * MAX_ID_CHARS
# + 10 characters ("C/workload/W"), 4 bytes a character at worst; plus 1 KiB of slots,
# dict entries and numpy columns.
PER_NODE_BYTES = (5 + 2 * 5) * (4 * (2 * MAX_ID_CHARS + 10) + 64) + 1024


def test_nodes_with_1mib_ids_are_refused_and_memory_stays_bounded(fleet: Fleet) -> None:
    def push_huge(i: int) -> int:
        huge = NodePush(node_id=f"{i}-" + "h" * (1 << 20), cluster_id="huge", score=0.5)
        reply = fleet.push([huge])
        assert reply.status == 200
        return ExportMetricsServiceResponse.FromString(
            reply.body
        ).partial_success.rejected_data_points

    for i in range(3):  # the receive path's buffers exist before the baseline is taken
        push_huge(i)
    assert fleet.proc is not None
    pid = fleet.proc.pid
    before_rss, before_refused = rss_bytes(pid), rejected(fleet, "too_long")
    refused = sum(push_huge(1000 + i) for i in range(300))
    growth = rss_bytes(pid) - before_rss
    # Bound by configuration: every node Fleet may track at its largest, plus a few request
    # bodies in flight. 300 accepted 1 MiB ids would be 300 MiB.
    bound = MAX_NODES * PER_NODE_BYTES + 4 * MAX_BODY
    assert growth <= bound, f"RSS grew {growth >> 20} MiB, bound {bound >> 20} MiB"
    assert refused == 300
    assert rejected(fleet, "too_long") == before_refused + 300
    serving(fleet)


# ---- 7. the bearer scheme is case-insensitive ------------------------------------------


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "bEaReR"])
def test_bearer_scheme_in_any_case_on_every_listener(fleet: Fleet, scheme: str) -> None:
    auth = {"Authorization": f"{scheme} {TOKEN}"}
    body = health_request(GOOD[:1]).SerializeToString()
    reply = fleet.request(
        fleet.otlp_http,
        "POST",
        "/v1/metrics",
        body,
        {"Content-Type": "application/x-protobuf", **auth},
    )
    assert reply.status == 200, Status.FromString(reply.body).message
    assert fleet.request(fleet.api, "GET", "/metrics", headers=auth).status == 200
    with grpc.insecure_channel(fleet.otlp_grpc) as channel:
        export = channel.unary_unary(
            "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
            request_serializer=lambda b: b,
            response_deserializer=ExportMetricsServiceResponse.FromString,
        )
        export(body, timeout=10, metadata=(("authorization", f"{scheme} {TOKEN}"),))
    # the token itself is still compared exactly
    wrong = {"Authorization": f"{scheme} {TOKEN.upper()}"}
    assert fleet.request(fleet.api, "GET", "/metrics", headers=wrong).status == 401
