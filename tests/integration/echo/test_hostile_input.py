"""Hostile input on the real ``ingero echo``: deeply nested OTLP/JSON and over-long ids.

Each request is refused as a whole with a clear 400 and a counted reason (``malformed``,
``too_long``), nothing of it is stored, the daemon keeps serving, and refused requests
leave no memory behind beyond a few request bodies. The API's JSON body (SQL) nested past
the interpreter's recursion limit is a 400 too, and a stored string no UTF-8 can hold is
answered, not a 500.
"""

from __future__ import annotations

import json
import sqlite3
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import grpc
import httpx2
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from ingero.echo.rows import EXTRA, INSERT_EVENT, event_row
from ingero.otlp.health import NodePush, encode_health
from ingero.otlp.limits import MAX_EVENT_BYTES, MAX_ID_CHARS, MAX_JSON_DEPTH
from ingero.otlp.logs import encode_events
from ingero.schema.events import Event
from tests.integration.procfs import rss_bytes

from .helpers import TOKEN_OPS, EchoProcess, http, straggler

pytestmark = pytest.mark.integration

PROTOBUF = "application/x-protobuf"
MAX_REQUEST_BYTES = 2_000_000  # what EchoProcess configures


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EchoProcess]:
    # decode_workers 0: every request is decoded in the process whose memory is measured
    proc = EchoProcess(Path(tmp_path_factory.mktemp("echo-hostile")), decode_workers=0)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def post(echo: EchoProcess, path: str, body: bytes, ctype: str = PROTOBUF) -> tuple[int, Any]:
    return http("POST", f"http://{echo.otlp_http}{path}", body, TOKEN_OPS, content_type=ctype)


def rejected(echo: EchoProcess) -> dict[str, int]:
    status, body = http("GET", f"{echo.url}/api/v1/status", token=TOKEN_OPS)
    assert status == 200
    return dict(body["ingest"]["rejected"])


def stored(echo: EchoProcess, cluster: str) -> int:
    query = json.dumps({"query": f"SELECT count(*) FROM events WHERE cluster_id = '{cluster}'"})
    status, body = http("POST", f"{echo.url}/api/v1/sql", query.encode(), TOKEN_OPS)
    assert status == 200, body
    return int(body["rows"][0][0])


def serving(echo: EchoProcess) -> None:
    assert echo.proc is not None and echo.proc.poll() is None
    assert http("GET", f"{echo.url}/healthz")[0] == 200
    assert "Traceback" not in echo.log()


@pytest.mark.parametrize("path", ["/v1/logs", "/v1/metrics"])
@pytest.mark.parametrize(
    "body",
    [
        b'{"resourceLogs":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
        b'{"resourceLogs":[' + b'{"a":' * (MAX_JSON_DEPTH - 1) + b"1" + b"}" * (MAX_JSON_DEPTH - 1)
        + b"]}",
    ],
    ids=["arrays", "objects", "limit+1"],
)  # fmt: skip
def test_deeply_nested_json_is_400_malformed(echo: EchoProcess, path: str, body: bytes) -> None:
    before = rejected(echo).get("malformed", 0)
    status, answer = post(echo, path, body, "application/json")
    assert status == 400, answer
    assert answer["error"] == f"malformed JSON: nested deeper than {MAX_JSON_DEPTH} levels"
    assert rejected(echo)["malformed"] == before + 1
    serving(echo)


LONG = "x" * (MAX_ID_CHARS + 1)


def event_over_a_limit(field: str) -> Event:
    event = straggler("ok-node", "hostile", 1000.0)
    if field == "extra key":
        event.extra[LONG] = 1
    elif field == "record":
        event.extra["note"] = "z" * MAX_EVENT_BYTES
    else:
        setattr(event, field, LONG)
    return event


@pytest.mark.parametrize(
    "field",
    ["node_id", "cluster_id", "job_id", "detection_mode", "dominant_signal", "extra key", "record"],
)
def test_an_event_over_a_limit_refuses_its_request_as_too_long(
    echo: EchoProcess, field: str
) -> None:
    before = rejected(echo).get("too_long", 0)
    good = straggler("ok-node", "hostile", 999.0)
    request = encode_events([good, event_over_a_limit(field)])
    status, answer = post(echo, "/v1/logs", request.SerializeToString())
    assert status == 400, answer
    assert "1 of 2 log records rejected, nothing stored" in answer["error"]
    assert "the limit is" in answer["error"] and "zzzzzzzzzz" not in answer["error"]
    with grpc.insecure_channel(echo.otlp_grpc) as channel:
        stub = logs_service_pb2_grpc.LogsServiceStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.RpcError) as info:
            stub.Export(request, timeout=30, metadata=[("authorization", f"Bearer {TOKEN_OPS}")])
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert rejected(echo)["too_long"] == before + 2
    assert stored(echo, "hostile") == 0
    serving(echo)


@pytest.mark.parametrize("field", ["dominant_signal", "detection_mode"])
def test_a_map_where_a_name_belongs_is_400_not_a_failed_commit(
    echo: EchoProcess, field: str
) -> None:
    before = rejected(echo).get("invalid_event", 0)
    request = encode_events([straggler("ok-node", "hostile", 1000.0)])
    attrs = request.resource_logs[0].scope_logs[0].log_records[0].attributes
    kv = next(kv for kv in attrs if kv.key == field) if field == "dominant_signal" else None
    if kv is None:
        kv = attrs.add()
        kv.key = field
    kv.value.kvlist_value.values.add(key="a").value.int_value = 1
    status, answer = post(echo, "/v1/logs", request.SerializeToString())
    assert status == 400 and f"{field} must be a string" in answer["error"], answer
    assert rejected(echo)["invalid_event"] == before + 1
    assert stored(echo, "hostile") == 0
    serving(echo)


def test_events_and_scores_at_the_limits_are_stored(echo: EchoProcess) -> None:
    at = "y" * MAX_ID_CHARS
    event = straggler(at, "edge", 1000.0, job=at)
    event.extra["note"] = "n" * (MAX_EVENT_BYTES - 2000)  # the record stays under its limit
    assert post(echo, "/v1/logs", encode_events([event]).SerializeToString())[0] == 200
    assert stored(echo, "edge") == 1
    push = NodePush(node_id=at, cluster_id="edge", score=0.5, host_name=at, gpu_model=at)
    request = encode_health(push, 1_000_000_000_000)
    assert post(echo, "/v1/metrics", request.SerializeToString())[0] == 200


@pytest.mark.parametrize("field", ["node_id", "cluster_id", "job_id", "host_name", "gpu_model"])
def test_a_score_over_a_limit_refuses_its_request_as_too_long(
    echo: EchoProcess, field: str
) -> None:
    before = rejected(echo).get("too_long", 0)
    push = NodePush(**{"node_id": "n", "cluster_id": "hostile", "score": 0.5, field: LONG})  # type: ignore[arg-type]
    status, answer = post(echo, "/v1/metrics", encode_health(push, 1).SerializeToString())
    assert status == 400 and "characters long, the limit is" in answer["error"], answer
    assert rejected(echo)["too_long"] == before + 1


def test_events_with_huge_ids_are_refused_and_memory_stays_bounded(echo: EchoProcess) -> None:
    def send(i: int) -> int:
        # 512 KiB: the record carries the id twice (attribute and message), within the
        # request limit
        event = straggler(f"{i}-" + "h" * (1 << 19), "huge", 1000.0 + i)
        request: ExportLogsServiceRequest = encode_events([event])
        return post(echo, "/v1/logs", request.SerializeToString())[0]

    for i in range(3):  # the receive path's buffers exist before the baseline is taken
        send(i)
    assert echo.proc is not None
    pid = echo.proc.pid
    before = rss_bytes(pid)
    statuses = [send(1000 + i) for i in range(300)]
    growth = rss_bytes(pid) - before
    # Refused requests keep nothing: the bound is a few request bodies in flight (each
    # read, parsed and decoded once). 300 stored 512 KiB ids would be over 150 MiB.
    bound = 8 * MAX_REQUEST_BYTES
    assert growth <= bound, f"RSS grew {growth >> 20} MiB, bound {bound >> 20} MiB"
    assert statuses == [400] * 300
    assert stored(echo, "huge") == 0
    serving(echo)


def test_a_sql_body_nested_past_the_recursion_limit_is_a_400(echo: EchoProcess) -> None:
    for body in (b"[" * 5000 + b"]" * 5000, b'{"query":' * 3000 + b"1" + b"}" * 3000):
        status, answer = http("POST", f"{echo.url}/api/v1/sql", body, TOKEN_OPS)
        assert status == 400, answer
        assert answer["error"] == (
            f"the body must be JSON: nested deeper than {MAX_JSON_DEPTH} levels"
        )
    serving(echo)


async def _mcp_events(url: str) -> tuple[Any, Any]:
    headers = {"Authorization": f"Bearer {TOKEN_OPS}"}
    transport = streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers))
    async with Client(transport) as client:
        result = await client.call_tool("events", {"cluster_id": "odd", "since": 0})
        return result.structured_content, result.content[0].text  # type: ignore[union-attr]


def test_a_lone_surrogate_in_a_stored_event_is_answered(tmp_path: Path) -> None:
    """JSON can spell a lone UTF-16 surrogate; an event's ``extra`` holding one (a store
    written by another tool, or by hand) is answered, escaped, on every surface."""
    echo = EchoProcess(tmp_path)
    echo.start().stop()  # the store's schema
    row = event_row(straggler("odd-node", "odd", 1000.0, job="5"), 1000.0)
    extra = '{"note":"\\ud800 lone","pair":"\\ud83d\\ude00"}'  # JSON text, ASCII
    conn = sqlite3.connect(echo.db)
    with conn:
        conn.execute(INSERT_EVENT, (*row[:EXTRA], extra))
    conn.close()
    echo.start()
    try:
        status, raw = http_raw(f"{echo.url}/api/v1/events?cluster_id=odd&since=0")
        assert status == 200, raw
        (event,) = json.loads(raw)["events"]
        assert event["extra"] == {"note": "\ud800 lone", "pair": "\U0001f600"}
        status, raw = http_raw(f"{echo.url}/api/v1/job_report?job_id=5")
        assert status == 200 and json.loads(raw)["found"], raw
        structured, text = anyio.run(_mcp_events, f"{echo.url}/mcp")
        assert json.loads(text)["events"][0]["extra"]["note"] == "\ud800 lone"
        # MCP's structured content is UTF-8: the unpaired surrogate shows as U+FFFD
        assert structured["events"][0]["extra"] == {"note": "\ufffd lone", "pair": "\U0001f600"}
        serving(echo)
    finally:
        echo.stop()


def http_raw(url: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN_OPS}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
