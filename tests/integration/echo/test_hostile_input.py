"""Hostile input on the real ``ingero echo``: deeply nested OTLP/JSON and over-long ids.

Each request is refused as a whole with a clear 400 and a counted reason (``malformed``,
``too_long``), nothing of it is stored, the daemon keeps serving, and refused requests
leave no memory behind beyond a few request bodies.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from ingero.events import Event
from ingero.otlp.health import NodePush, encode_health
from ingero.otlp.limits import MAX_EVENT_BYTES, MAX_ID_CHARS, MAX_JSON_DEPTH
from ingero.otlp.logs import encode_events
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
