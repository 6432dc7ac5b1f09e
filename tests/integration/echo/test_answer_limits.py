"""Every answer of the real daemon is bounded in bytes, and so is Echo's memory for it.

Memory is the daemon's peak resident set (``VmHWM`` in ``/proc/<pid>/status``, reset by
writing 5 to ``clear_refs`` before each attempt), so a spike freed before it is read still
counts. Bounds are multiples of the configured limit: a JSON answer is held about three
times over (as rows, as the rendered body, in the socket buffer), and one row of the
attack (40 kB and its base64) beside it.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from http.client import HTTPResponse
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

from ingero.echo.api import MAX_SQL_BODY
from ingero.otlp.logs import encode_events
from ingero.schema.events import Event

from .helpers import TOKEN_A, TOKEN_OPS, EchoProcess, http, straggler

pytestmark = pytest.mark.integration

MAX_ANSWER = 1024**2
MiB = 1024**2
# The outside test's attack: 10,000 rows of a 40 kB zeroblob (400 MB, 533 MB as base64).
ZEROBLOBS = (
    "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 10000)"
    " SELECT i, zeroblob(40000) FROM c"
)


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EchoProcess]:
    proc = EchoProcess(
        Path(tmp_path_factory.mktemp("echo")),
        limits={"sql_max_rows": 10_000, "sql_timeout": "3s", "max_answer_bytes": MAX_ANSWER},
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def _status_bytes(echo: EchoProcess, key: str) -> int:
    assert echo.proc is not None
    for line in Path(f"/proc/{echo.proc.pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} in /proc/<pid>/status")


def _reset_peak(echo: EchoProcess) -> int:
    """Start counting the peak anew; returns the resident set now."""
    assert echo.proc is not None
    Path(f"/proc/{echo.proc.pid}/clear_refs").write_text("5")
    return _status_bytes(echo, "VmRSS")


def _peak_growth(echo: EchoProcess, base: int) -> int:
    return _status_bytes(echo, "VmHWM") - base


def _sql(echo: EchoProcess, query: str, token: str = TOKEN_A) -> tuple[int, Any]:
    return http("POST", f"{echo.url}/api/v1/sql", json.dumps({"query": query}).encode(), token)


async def _mcp(url: str, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    headers = {"Authorization": f"Bearer {TOKEN_A}"}
    transport = streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers))
    out = []
    async with Client(transport) as client:
        for name, args in calls:
            result = await client.call_tool(name, args)
            assert not result.is_error, result.content
            out.append(result.structured_content)
    return out


def test_the_zeroblob_attack_is_cut_at_the_byte_limit_and_memory_stays_bounded(
    echo: EchoProcess,
) -> None:
    assert _sql(echo, "SELECT zeroblob(40000) FROM (SELECT 1 UNION SELECT 2)")[0] == 200  # warm
    base = _reset_peak(echo)
    status, body = _sql(echo, ZEROBLOBS)
    growth = _peak_growth(echo, base)
    assert status == 200, body
    assert (body["truncated"], body["truncated_reason"]) == (True, "bytes")
    rows = body["rows"]
    assert rows and [r[0] for r in rows] == list(range(1, len(rows) + 1))
    assert len(json.dumps(body["rows"], separators=(",", ":"))) <= MAX_ANSWER
    assert growth < 8 * MAX_ANSWER, f"peak RSS grew {growth / MiB:.1f} MiB"
    # the same attack through MCP
    (answer,) = anyio.run(_mcp, f"{echo.url}/mcp", [("sql", {"query": ZEROBLOBS})])
    assert (answer["truncated_reason"], answer["row_count"]) == ("bytes", len(rows))


def test_rows_and_time_cut_answers_with_their_reasons(echo: EchoProcess) -> None:
    status, body = _sql(
        echo, "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c) SELECT i FROM c"
    )
    assert (status, body["row_count"], body["truncated_reason"]) == (200, 10_000, "rows")
    status, body = _sql(
        echo,
        "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c)"
        " SELECT i FROM c WHERE i % 10000 = 1",
    )
    assert (status, body["rows"][0], body["truncated_reason"]) == (200, [1], "time")
    status, body = _sql(echo, "SELECT 1")
    assert (body["truncated"], body["truncated_reason"]) == (False, None)


def test_question_answers_are_cut_at_the_byte_limit_too(echo: EchoProcess) -> None:
    """Events whose ``extra`` is large: 120 of 15 kB each (the wire's event limit is 16 KiB),
    1.8 MB in all."""
    url = f"http://{echo.otlp_http}/v1/logs"
    for part in range(3):
        events = [
            straggler(
                f"big{part}-{i}",
                "A",
                5000.0 + 100 * part + i,
                job="9",
                kind="job_summary",
                note="x" * 15_000,
            )
            for i in range(40)
        ]
        status, _ = http(
            "POST", url, encode_events(events).SerializeToString(), TOKEN_OPS,
            "application/x-protobuf",
        )  # fmt: skip
        assert status == 200
    for name, params, key in [
        ("events", "type=job_summary&since=0&until=9000&limit=1000", "events"),
        ("job_report", "job_id=9", "summaries"),
    ]:
        status, body = http("GET", f"{echo.url}/api/v1/{name}?{params}", token=TOKEN_A)
        assert status == 200, body
        assert (body["truncated"], body["truncated_reason"]) == (True, "bytes"), name
        assert 0 < len(body[key]) < 120 and len(json.dumps(body)) <= MAX_ANSWER + 1024
    answers = anyio.run(
        _mcp,
        f"{echo.url}/mcp",
        [
            ("events", {"type": "job_summary", "since": 0, "until": 9000, "limit": 1000}),
            ("summary", {}),
        ],
    )
    assert answers[0]["truncated_reason"] == "bytes" and 0 < len(answers[0]["events"]) < 120
    assert (answers[1]["truncated"], answers[1]["truncated_reason"]) == (False, None)


def test_collective_lag_is_cut_at_the_byte_limit_too(echo: EchoProcess) -> None:
    """100 hung collectives of one job, each naming 2,500 missing ranks (~15 kB of JSON
    apiece, 1.5 MB in all): the hangs are cut short, and so is job_report's list of them."""
    url = f"http://{echo.otlp_http}/v1/logs"
    for part in range(4):
        events = [
            Event(
                "collective_hang",
                "n0",
                "A",
                7000.0 + 25 * part + i,
                job_id="h9",
                extra={"seq": 25 * part + i, "missing_ranks": list(range(10_000, 12_500))},
            )
            for i in range(25)
        ]
        status, _ = http(
            "POST", url, encode_events(events).SerializeToString(), TOKEN_OPS,
            "application/x-protobuf",
        )  # fmt: skip
        assert status == 200
    status, body = http(
        "GET",
        f"{echo.url}/api/v1/collective_lag?job_id=h9&since=0&until=9000&limit=1000",
        token=TOKEN_A,
    )
    assert status == 200, body
    assert (body["truncated"], body["truncated_reason"]) == (True, "bytes")
    compact = json.dumps(body, separators=(",", ":"))  # as the budget counts (and Echo sends)
    assert 0 < len(body["hangs"]) < 100 and len(compact) <= MAX_ANSWER + 1024
    # the newest first: what is cut is the oldest
    assert body["hangs"][0]["seq"] == 99 and len(body["hangs"][0]["missing_ranks"]) == 2500
    status, report = http("GET", f"{echo.url}/api/v1/job_report?job_id=h9", token=TOKEN_A)
    assert status == 200 and report["truncated_reason"] == "bytes"
    assert 0 < len(report["collective_hangs"]) < 100


def _post_raw(echo: EchoProcess, head: str, body: Iterator[bytes]) -> tuple[int, bytes]:
    """Send a request by hand (the body as it comes, stopping if Echo closes); returns
    the status and the response body."""
    host, _, port = echo.api.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode())
        try:
            for chunk in body:
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        response = HTTPResponse(sock)
        response.begin()
        return response.status, response.read()


def _head(echo: EchoProcess, length_header: str) -> str:
    return (
        f"POST /api/v1/sql HTTP/1.1\r\nHost: {echo.api}\r\n"
        f"Authorization: Bearer {TOKEN_A}\r\nContent-Type: application/json\r\n"
        f"{length_header}\r\n\r\n"
    )


BIG = 128 * MiB


def test_a_large_sql_body_is_refused_from_content_length_without_reading_it(
    echo: EchoProcess,
) -> None:
    # the head alone is enough for the answer: Echo does not wait for the body
    status, body = _post_raw(echo, _head(echo, f"Content-Length: {256 * MiB}"), iter(()))
    assert status == 413 and f"over {MAX_SQL_BODY} bytes" in body.decode()
    base = _reset_peak(echo)
    chunk = b"x" * MiB
    status, _ = _post_raw(
        echo, _head(echo, f"Content-Length: {BIG}"), (chunk for _ in range(BIG // MiB))
    )
    growth = _peak_growth(echo, base)
    assert status == 413
    assert growth < BIG // 8, f"peak RSS grew {growth / MiB:.1f} MiB"
    assert _sql(echo, "SELECT 1")[1]["rows"] == [[1]]  # still serving


def test_a_large_chunked_sql_body_is_refused_once_it_passes_the_limit(echo: EchoProcess) -> None:
    base = _reset_peak(echo)
    piece = b"x" * MiB
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    chunks = [*(chunk for _ in range(BIG // MiB)), b"0\r\n\r\n"]
    status, body = _post_raw(echo, _head(echo, "Transfer-Encoding: chunked"), iter(chunks))
    growth = _peak_growth(echo, base)
    assert status == 413 and f"over {MAX_SQL_BODY} bytes" in body.decode()
    assert growth < BIG // 8, f"peak RSS grew {growth / MiB:.1f} MiB"
    # a small chunked body is read as usual
    query = json.dumps({"query": "SELECT 2"}).encode()
    small = [f"{len(query):x}\r\n".encode() + query + b"\r\n", b"0\r\n\r\n"]
    status, body = _post_raw(echo, _head(echo, "Transfer-Encoding: chunked"), iter(small))
    assert status == 200 and json.loads(body)["rows"] == [[2]]
