"""``ingero echo`` as a real process: OTLP in (HTTP and gRPC), bad input, API, OpenAPI, MCP.

Tenancy is checked on every surface: HTTP questions, SQL, MCP over streamable HTTP and MCP
over stdio (``ingero mcp --echo URL``), each with a token scoped to cluster A only.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import anyio
import grpc
import httpx2
import pytest
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from openapi_spec_validator import validate
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from ingero.otlp.health import NodePush, encode_health
from ingero.otlp.logs import encode_events
from ingero.otlp.values import to_json

from .helpers import TOKEN_A, TOKEN_OPS, EchoProcess, http, straggler

pytestmark = pytest.mark.integration

PROTOBUF = "application/x-protobuf"


def post_logs(
    echo: EchoProcess,
    request: ExportLogsServiceRequest,
    json_body: bool = False,
    token: str | None = TOKEN_OPS,
) -> Any:
    body = to_json(request) if json_body else request.SerializeToString()
    ctype = "application/json" if json_body else PROTOBUF
    return http("POST", f"http://{echo.otlp_http}/v1/logs", body, token, content_type=ctype)


def grpc_export(echo: EchoProcess, request: ExportLogsServiceRequest, token: str | None) -> None:
    metadata = [("authorization", f"Bearer {token}")] if token else None
    with grpc.insecure_channel(echo.otlp_grpc) as channel:
        stub = logs_service_pb2_grpc.LogsServiceStub(channel)  # type: ignore[no-untyped-call]
        stub.Export(request, timeout=30, metadata=metadata)


def ask(echo: EchoProcess, name: str, token: str | None = TOKEN_OPS, **params: Any) -> Any:
    query = ("?" + urllib.parse.urlencode(params)) if params else ""
    return http("GET", f"{echo.url}/api/v1/{name}{query}", token=token)


def sql(echo: EchoProcess, query: str, token: str = TOKEN_OPS) -> Any:
    return http("POST", f"{echo.url}/api/v1/sql", json.dumps({"query": query}).encode(), token)


def stored(echo: EchoProcess, where: str = "1") -> int:
    status, body = sql(echo, f"SELECT count(*) FROM events WHERE {where}")
    assert status == 200, body
    return int(body["rows"][0][0])


@pytest.fixture(scope="module", autouse=True)
def seeded(echo: EchoProcess) -> None:
    """Cluster A and cluster B data, through both OTLP transports."""
    a = [straggler(f"a{i}", "A", 1000.0 + i, score=0.4) for i in range(4)]
    status, _ = post_logs(echo, encode_events(a))
    assert status == 200
    b = [straggler(f"bravo{i}", "B", 1000.0 + i, score=0.2) for i in range(3)]
    b.append(straggler("bravo0", "B", 1100.0, kind="node_drained", reason="ingero: test"))
    grpc_export(echo, encode_events(b), TOKEN_OPS)


def test_both_transports_store_and_the_api_answers(echo: EchoProcess) -> None:
    assert stored(echo, "cluster_id = 'A'") == 4 and stored(echo, "cluster_id = 'B'") == 4
    status, body = ask(echo, "stragglers", since=0)
    assert status == 200
    assert {r["node_id"] for r in body["stragglers"]} == {
        "a0",
        "a1",
        "a2",
        "a3",
        "bravo0",
        "bravo1",
        "bravo2",
    }
    # OTLP/JSON works as well, and a resend is not stored twice
    events = [straggler("a9", "A", 2000.0)]
    for _ in range(2):
        assert post_logs(echo, encode_events(events), json_body=True)[0] == 200
    assert stored(echo, "node_id = 'a9'") == 1


@pytest.mark.parametrize(
    ("size", "token", "want"),
    [(2_100_000, TOKEN_OPS, 413), (12_000_000, TOKEN_OPS, 413), (12_000_000, None, 401)],
)
def test_a_refused_body_gets_its_refusal_not_a_connection_reset(
    echo: EchoProcess, size: int, token: str | None, want: int
) -> None:
    # urllib writes the whole body, then reads the answer, and asks for the connection to
    # be closed after it: if Echo closed on the unread rest, the kernel sent a reset and
    # the sender saw "connection reset by peer" instead of the refusal (a CI failure)
    url = f"http://{echo.otlp_http}/v1/logs"
    for _ in range(5):
        status, answer = http("POST", url, b"\0" * size, token, content_type=PROTOBUF)
        assert status == want, answer


def test_bad_input_gets_a_clear_error_is_counted_and_nothing_is_stored_half(
    echo: EchoProcess,
) -> None:
    before = stored(echo)
    url = f"http://{echo.otlp_http}/v1/logs"
    good = straggler("half", "A", 3000.0)
    bad_record = encode_events([good, straggler("half2", "A", 3001.0)])
    # the second record's score becomes a string: the whole request must be refused
    for kv in bad_record.resource_logs[0].scope_logs[0].log_records[1].attributes:
        if kv.key == "score":
            kv.value.string_value = "very low"
    cases = [
        (b"\x0a\xff\xff\xff", PROTOBUF, 400, "malformed protobuf"),
        (b"{not json", "application/json", 400, "malformed JSON"),
        (b'{"resourceLogs": 5}', "application/json", 400, "invalid OTLP JSON"),
        (b"hello", "text/plain", 415, "Content-Type"),
        (b"\0" * 2_100_000, PROTOBUF, 413, "over 2000000 bytes"),
        (bad_record.SerializeToString(), PROTOBUF, 400, "score must be a finite number"),
    ]
    for body, ctype, want, message in cases:
        status, answer = http("POST", url, body, TOKEN_OPS, content_type=ctype)
        assert status == want, (message, answer)
        assert message in answer["error"]
    status, answer = http("POST", f"http://{echo.otlp_http}/v1/traces", b"", TOKEN_OPS)
    assert status == 404 and answer["error"] == "Not Found"
    nan = encode_events([good, straggler("half3", "A", 3002.0, lag_ms=float("nan"))])
    status, answer = post_logs(echo, nan)
    assert status == 400 and "finite JSON values" in answer["error"]
    missing = encode_events([good])
    attrs = missing.resource_logs[0].scope_logs[0].log_records[0].attributes
    del attrs[[kv.key for kv in attrs].index("node_id")]
    status, answer = post_logs(echo, missing)
    assert status == 400 and "missing node_id" in answer["error"]
    with pytest.raises(grpc.RpcError) as err:
        grpc_export(echo, bad_record, TOKEN_OPS)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert stored(echo) == before
    assert stored(echo, "node_id LIKE 'half%'") == 0
    status, body = http("GET", f"{echo.url}/api/v1/status", token=TOKEN_OPS)
    rejected = body["ingest"]["rejected"]
    assert rejected["malformed"] >= 3 and rejected["too_large"] >= 1
    assert rejected["invalid_event"] >= 3 and rejected["bad_content_type"] >= 1
    status, text = http("GET", f"{echo.url}/metrics", token=TOKEN_OPS)
    assert status == 200
    metrics = text.decode()
    assert (
        f'ingero_echo_ingest_rejected_total{{reason="malformed"}} {rejected["malformed"]}.0'
        in metrics
    )
    assert "ingero_echo_events_stored_total" in metrics
    assert http("GET", f"{echo.url}/metrics", token=TOKEN_A)[0] == 403
    # the API refuses bad questions the same way
    for name, params, message in [
        ("stragglers", {"limit": "lots"}, "limit must be an integer"),
        ("stragglers", {"colour": "red"}, "unknown parameter 'colour'"),
        ("events", {"since": "5", "until": "1"}, "since must not be after"),
        ("job_report", {}, "job_id is required"),
        ("nope", {}, "Not Found"),
    ]:
        status, answer = ask(echo, name, **params)
        assert status in (400, 404) and message in answer["error"], answer
    for body, message in [
        (b"SELECT 1", "must be JSON"),
        (b'["SELECT 1"]', "JSON object"),
        (b'{"query": "SELECT 1", "rows": 5}', "unknown parameter 'rows'"),
        (b'{"query": 5}', "non-empty string"),
    ]:
        status, answer = http("POST", f"{echo.url}/api/v1/sql", body, TOKEN_OPS)
        assert status == 400 and message in answer["error"], answer
    # the daemon is still serving
    assert ask(echo, "summary")[0] == 200


def test_no_token_or_a_wrong_token_is_401_everywhere(echo: EchoProcess) -> None:
    event = encode_events([straggler("intruder", "A", 5000.0)])
    for token in (None, "wrong-token-0123456789abcdef"):
        status, body = post_logs(echo, event, token=token)
        assert status == 401 and "bearer token" in body["error"]
        with pytest.raises(grpc.RpcError) as err:
            grpc_export(echo, event, token)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        status, body = ask(echo, "summary", token=token)
        assert status == 401 and "bearer token" in body["error"]
        assert sql(echo, "SELECT 1", token=token or "")[0] == 401
        status, _ = http("POST", f"{echo.url}/mcp", b"{}", token=token)
        assert status == 401


def test_a_cluster_a_token_gets_nothing_of_cluster_b_from_api_and_sql(echo: EchoProcess) -> None:
    for name, params in [
        ("summary", {"since": 0}),
        ("stragglers", {"since": 0}),
        ("outliers", {"since": 0}),
        ("events", {"since": 0}),
        ("drains", {"since": 0}),
        ("cost", {"since": 0}),
        ("job_report", {"job_id": "7"}),
        ("jobs", {"since": 0}),
        ("job_timeline", {"job_id": "7"}),
    ]:
        status, body = ask(echo, name, token=TOKEN_A, **params)
        assert status == 200 and "bravo" not in json.dumps(body) and '"B"' not in json.dumps(body)
        if name not in ("job_report", "job_timeline"):
            status, body = ask(echo, name, token=TOKEN_A, cluster_id="B")
            assert status == 403 and "no access to cluster 'B'" in body["error"]
    status, body = ask(echo, "job_timeline", token=TOKEN_A, job_id="7", cluster_id="B")
    assert status == 403 and "no access to cluster 'B'" in body["error"]
    status, body = ask(echo, "job_timeline", token=TOKEN_OPS, job_id="7")
    assert "bravo0" in json.dumps(body)
    status, body = ask(echo, "job_report", token=TOKEN_OPS, job_id="7")
    assert "bravo0" in json.dumps(body)  # the job spans both clusters; ops sees all of it
    assert sql(echo, "SELECT DISTINCT cluster_id FROM events", TOKEN_A)[1]["rows"] == [["A"]]
    status, body = sql(echo, "SELECT count(*) FROM main.events", TOKEN_A)
    assert status == 400 and "no such table: main.events" in body["error"]
    assert http("GET", f"{echo.url}/api/v1/status", token=TOKEN_A)[0] == 403
    assert stored(echo, "node_id = 'intruder'") == 0


def test_a_cluster_a_token_cannot_write_cluster_b(echo: EchoProcess) -> None:
    mixed = encode_events([straggler("sneak-a", "A", 6000.0), straggler("sneak-b", "B", 6000.0)])
    status, body = post_logs(echo, mixed, token=TOKEN_A)
    assert status == 403 and "may not write cluster 'B'" in body["error"]
    with pytest.raises(grpc.RpcError) as err:
        grpc_export(echo, mixed, TOKEN_A)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert stored(echo, "node_id LIKE 'sneak%'") == 0
    own = encode_events([straggler("sneak-a", "A", 6000.0)])
    assert post_logs(echo, own, token=TOKEN_A)[0] == 200
    assert stored(echo, "node_id = 'sneak-a'") == 1


async def _mcp_session(client: Client) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with client as c:
        out["tools"] = [t.name for t in (await c.list_tools()).tools]
        out["prompts"] = [p.name for p in (await c.list_prompts()).prompts]
        prompt = await c.get_prompt("investigate", {"cluster_id": "A", "job_id": "7"})
        out["prompt"] = prompt.messages[0].content.text  # type: ignore[union-attr]
        out["stragglers"] = (await c.call_tool("stragglers", {"since": 0})).structured_content
        out["idle_gpus"] = (await c.call_tool("idle_gpus", {"since": 0})).structured_content
        out["sql"] = (
            await c.call_tool("sql", {"query": "SELECT node_id FROM events"})
        ).structured_content
        denied = await c.call_tool("events", {"cluster_id": "B"})
        out["denied"] = (denied.is_error, denied.content[0].text)  # type: ignore[union-attr]
        bad = await c.call_tool("stragglers", {"limit": "many"})
        out["bad"] = (bad.is_error, bad.content[0].text)  # type: ignore[union-attr]
    return out


def _check_mcp(out: dict[str, Any]) -> None:
    assert out["tools"] == [
        "summary",
        "stragglers",
        "outliers",
        "events",
        "job_report",
        "collective_lag",
        "jobs",
        "job_timeline",
        "idle_gpus",
        "drains",
        "cost",
        "sql",
    ]
    assert out["prompts"] == ["investigate"] and "ingero explain --job 7" in out["prompt"]
    assert out["idle_gpus"]["episodes"] == [] and out["idle_gpus"]["truncated"] is False
    nodes = {r["node_id"] for r in out["stragglers"]["stragglers"]}
    assert nodes and not any(n.startswith("bravo") for n in nodes)
    assert out["sql"]["rows"] and all(not r[0].startswith("bravo") for r in out["sql"]["rows"])
    assert out["denied"][0] and "no access to cluster 'B'" in out["denied"][1]
    assert out["bad"][0] and "limit must be an integer" in out["bad"][1]


def test_mcp_over_streamable_http_with_a_scoped_token(echo: EchoProcess) -> None:
    headers = {"Authorization": f"Bearer {TOKEN_A}"}
    transport = streamable_http_client(
        f"{echo.url}/mcp", http_client=httpx2.AsyncClient(headers=headers)
    )
    _check_mcp(anyio.run(_mcp_session, Client(transport)))


def test_mcp_over_stdio_through_ingero_mcp(echo: EchoProcess) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "ingero.cli.main", "mcp", "--echo", echo.url],
        env={"INGERO_ECHO_TOKEN": TOKEN_A},
    )
    _check_mcp(anyio.run(_mcp_session, Client(params)))


def test_openapi_document_is_valid_and_every_response_matches_it(
    echo: EchoProcess, tmp_path: Path
) -> None:
    status, doc = http("GET", f"{echo.url}/api/v1/openapi.json")
    assert status == 200
    validate(doc)
    # schemathesis drives every operation and checks status codes, content types and each
    # response body against its schema. positive_data_acceptance is left out because some
    # schema-valid input is rightly refused for reasons a schema cannot say (bad SQL syntax,
    # since after until).
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "run",
            f"{echo.url}/api/v1/openapi.json",
            "--checks",
            "all",
            "--exclude-checks",
            "positive_data_acceptance",
            "--max-examples",
            "5",
            "--phases",
            "examples,coverage,fuzzing",
            "--seed",
            "7",
            "-H",
            f"Authorization: Bearer {TOKEN_OPS}",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,  # schemathesis leaves a .schemathesis/ folder behind
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_a_second_echo_on_the_same_database_is_refused(echo: EchoProcess, tmp_path: Any) -> None:
    other = EchoProcess(tmp_path)
    other.db = echo.db
    config = json.loads((tmp_path / "echo.yaml").read_text())
    config["db"] = str(echo.db)
    (tmp_path / "echo.yaml").write_text(json.dumps(config))
    result = subprocess.run(
        [sys.executable, "-m", "ingero.cli.main", "echo", "--config", str(tmp_path / "echo.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 69
    assert "another ingero echo is already writing this database" in result.stderr


def test_health_scores_become_history_and_outliers_and_bad_metrics_are_refused(
    echo: EchoProcess,
) -> None:
    request = ExportMetricsServiceRequest()
    for minute in range(3):
        for i in range(6):
            push = NodePush(
                node_id=f"gpu{i}",
                cluster_id="A",
                score=0.3 if i == 0 else 0.9,
                gpu_model="NVIDIA H100",
                gpu_count=8,
            )
            part = encode_health(push, int((10_000 + 60 * minute) * 1e9))
            request.resource_metrics.extend(part.resource_metrics)
    url = f"http://{echo.otlp_http}/v1/metrics"
    for _ in range(2):  # a resend must not count twice
        status, _ = http("POST", url, request.SerializeToString(), TOKEN_OPS, PROTOBUF)
        assert status == 200
    status, body = sql(echo, "SELECT sum(n), count(*) FROM scores WHERE node_id LIKE 'gpu%'")
    assert body["rows"] == [[18, 18]]
    status, body = ask(echo, "outliers", cluster_id="A", since=0, until=20_000)
    assert [o["node_id"] for o in body["outliers"]] == ["gpu0"]
    bad = encode_health(NodePush(node_id="gpu9", cluster_id="A", score=0.5), 10**9)
    bad.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0].as_double = 7.0
    status, body = http("POST", url, bad.SerializeToString(), TOKEN_OPS, PROTOBUF)
    assert status == 400 and "not in [0, 1]" in body["error"]
    assert sql(echo, "SELECT count(*) FROM scores WHERE node_id = 'gpu9'")[1]["rows"] == [[0]]
