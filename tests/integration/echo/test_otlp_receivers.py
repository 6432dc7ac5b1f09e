"""Fleet and Echo answer the same OTLP input the same way: one receiver core.

The same bad request, byte for byte, sent to a real ``ingero fleet`` and a real ``ingero
echo`` (with the same body limit) gets the same status, Content-Type and body from both,
over HTTP and gRPC. And Echo takes gzip from the official OpenTelemetry SDK exporters,
as Fleet always has.
"""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc.status_pb2 import Status
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import LogRecordExportResult, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource

from ingero.otlp.limits import MAX_JSON_DEPTH
from ingero.schema.events import Event
from tests.integration.fleet.helpers import Fleet, start_fleet, wait_for
from tests.integration.fleet.test_push_paths import recorded, sdk_push

from .helpers import TOKEN_OPS, EchoProcess

pytestmark = pytest.mark.integration

LIMIT = 2_000_000  # Echo's max_body_bytes in EchoProcess; Fleet gets the same
PROTOBUF = "application/x-protobuf"
JSON = "application/json"


@pytest.fixture(scope="module")
def daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    echo = EchoProcess(Path(tmp_path_factory.mktemp("echo")), decode_workers=0).start()
    try:
        fleet = start_fleet(
            Path(tmp_path_factory.mktemp("fleet")), {"limits": {"max_body_bytes": LIMIT}}
        )
    except BaseException:
        echo.stop()
        raise
    try:
        yield {"fleet": fleet, "echo": echo}
    finally:
        fleet.stop()
        echo.stop()


def otlp_http(daemon: Fleet | EchoProcess) -> tuple[str, int]:
    host, _, port = daemon.otlp_http.rpartition(":")
    return host, int(port)


def exchange(
    daemon: Fleet | EchoProcess,
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes,
    send_body: bool = True,
) -> tuple[int, str, bytes]:
    """(status, Content-Type, body) of one request on its own connection; the body is
    announced (Content-Length) but left unsent when ``send_body`` is false."""
    head = [f"{method} {path} HTTP/1.1", "Host: x", "Connection: close"]
    head += [f"{k}: {v}" for k, v in {**headers, "Content-Length": str(len(body))}.items()]
    head.append(f"Authorization: Bearer {TOKEN_OPS}")
    with socket.create_connection(otlp_http(daemon), timeout=30) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + (body if send_body else b""))
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, response.getheader("content-type", ""), response.read()


NESTED = b'{"resourceLogs":' + b"[" * (MAX_JSON_DEPTH + 5) + b"]" * (MAX_JSON_DEPTH + 5) + b"}"
BOMB = gzip.compress(b"\0" * (3 * LIMIT))

# (what, method, path, headers, body, the status both answer)
CASES = [
    ("malformed protobuf", "POST", "/v1/logs", {"Content-Type": PROTOBUF}, b"\x0a\xff\xff\xff", 400),
    ("malformed JSON", "POST", "/v1/metrics", {"Content-Type": JSON}, b"{not json", 400),
    ("not OTLP JSON", "POST", "/v1/logs", {"Content-Type": JSON}, b'{"resourceLogs": 5}', 400),
    ("JSON too deep", "POST", "/v1/logs", {"Content-Type": JSON}, NESTED, 400),
    ("other media type", "POST", "/v1/logs", {"Content-Type": "text/plain"}, b"hello", 415),
    ("other encoding", "POST", "/v1/logs",
     {"Content-Type": PROTOBUF, "Content-Encoding": "br"}, b"x", 415),
    ("broken gzip", "POST", "/v1/metrics",
     {"Content-Type": JSON, "Content-Encoding": "gzip"}, b"not gzip", 400),
    ("truncated gzip", "POST", "/v1/logs",
     {"Content-Type": PROTOBUF, "Content-Encoding": "gzip"}, gzip.compress(b"x" * 100)[:-12], 400),
    ("gzip bomb", "POST", "/v1/logs",
     {"Content-Type": PROTOBUF, "Content-Encoding": "gzip"}, BOMB, 413),
    ("no such path", "POST", "/v1/traces", {"Content-Type": JSON}, b"{}", 404),
    ("not POST", "GET", "/v1/logs", {"Content-Type": PROTOBUF}, b"", 405),
]  # fmt: skip


@pytest.mark.parametrize(
    ("method", "path", "headers", "body", "status"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_the_same_bad_request_gets_the_same_answer_from_fleet_and_echo(
    daemons: dict[str, Any],
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes,
    status: int,
) -> None:
    fleet = exchange(daemons["fleet"], method, path, headers, body)
    echo = exchange(daemons["echo"], method, path, headers, body)
    assert fleet == echo
    assert fleet[0] == status
    # a google.rpc.Status in the request's encoding, its code from the one status table
    if fleet[1] == JSON:
        answer = json.loads(fleet[2])
        assert answer["error"] == answer["message"] and answer["status"] == status
    else:
        assert fleet[1] == PROTOBUF
        assert Status.FromString(fleet[2]).message


def test_a_body_over_the_limit_is_refused_alike_before_it_is_read(
    daemons: dict[str, Any],
) -> None:
    headers = {"Content-Type": PROTOBUF}
    body = b"\0" * (LIMIT + 1)
    fleet = exchange(daemons["fleet"], "POST", "/v1/logs", headers, body, send_body=False)
    echo = exchange(daemons["echo"], "POST", "/v1/logs", headers, body, send_body=False)
    assert fleet == echo
    assert (
        fleet[0] == 413
        and Status.FromString(fleet[2]).message == f"request body over {LIMIT} bytes"
    )


def test_a_malformed_grpc_message_gets_the_same_code_and_details(
    daemons: dict[str, Any],
) -> None:
    answers = []
    for daemon in (daemons["fleet"], daemons["echo"]):
        with grpc.insecure_channel(daemon.otlp_grpc) as channel:
            export = channel.unary_unary(
                "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
                request_serializer=None,
                response_deserializer=None,
            )
            with pytest.raises(grpc.RpcError) as err:
                export(
                    b"\x0a\xff\xff\xff",
                    timeout=30,
                    metadata=[("authorization", f"Bearer {TOKEN_OPS}")],
                )
            answers.append((err.value.code(), err.value.details()))
    assert answers[0] == answers[1]
    assert answers[0][0] == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed protobuf" in answers[0][1]


def stored(echo: EchoProcess, sql: str) -> int:
    conn = sqlite3.connect(f"file:{echo.db}?mode=ro", uri=True, timeout=30)
    try:
        return int(conn.execute(sql).fetchone()[0])
    finally:
        conn.close()


def test_echo_takes_gzip_from_the_official_sdk_http_exporters(daemons: dict[str, Any]) -> None:
    echo: EchoProcess = daemons["echo"]
    url = f"http://{echo.otlp_http}"
    auth = {"Authorization": f"Bearer {TOKEN_OPS}"}
    # a health score, as a node's SDK would push it (the same helper pushes Fleet's)
    sdk_push(
        OTLPMetricExporter(
            endpoint=f"{url}/v1/metrics", headers=auth, compression=Compression.Gzip, timeout=30
        ),
        "gz-node",
        0.75,
        "gz",
    )
    # an ingero event, as an SDK logger would send it
    event = Event("straggler_state", "gz-node", "gz", 1.7e9, score=0.4, threshold=0.8)
    exporter = OTLPLogExporter(
        endpoint=f"{url}/v1/logs", headers=auth, compression=Compression.Gzip, timeout=30
    )
    results = recorded(exporter)
    provider = LoggerProvider(resource=Resource.create({"service.name": "gz"}))
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    attributes = {k: v for k, v in event.to_dict().items() if v is not None and v != {}}
    provider.get_logger("ingero").emit(
        timestamp=int(event.timestamp * 1e9), body=event.message(), attributes=attributes
    )
    provider.shutdown()
    assert results == [LogRecordExportResult.SUCCESS]
    wait_for(
        lambda: stored(echo, "SELECT count(*) FROM nodes WHERE node_id = 'gz-node'") == 1,
        30,
        "the SDK's score in echo",
    )
    assert stored(echo, f"SELECT count(*) FROM events WHERE event_id = '{event.event_id}'") == 1
