"""NCCL peer lag and hung collectives in a real ``ingero echo``: events sent as OTLP logs
(the codec Fleet forwards with), folded into episodes whatever their order and however
often a batch is resent, and asked for over HTTP and through the official MCP client, with
a token scoped to one cluster seeing nothing of another."""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

import anyio
import httpx2
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from openapi_spec_validator import validate

from ingero.otlp.logs import encode_events
from ingero.schema.events import Event

from .helpers import TOKEN_A, TOKEN_B, TOKEN_OPS, EchoProcess, http, straggler

pytestmark = pytest.mark.integration

PROTOBUF = "application/x-protobuf"
JOB = "1234"
COMM = "9f3c2a1e0b8d4c7a"


def lag(node: str, cluster: str, ts: float, comm_rank: int, eid: str, **fields: Any) -> Event:
    extra = {
        "comm_hash": COMM,
        "comm_rank": comm_rank,
        "nranks": 64,
        "op": "allreduce",
        "collectives": 20,
        "bytes": 1 << 26,
        "state": "start",
        **fields,
    }
    return Event(
        "peer_lag", node, cluster, ts, event_id=eid, job_id=JOB, rank=comm_rank, extra=extra
    )


def hang(node: str, ts: float, eid: str, **fields: Any) -> Event:
    extra = {"comm_hash": COMM, "op": "allreduce", "nranks": 64, "state": "start", **fields}
    return Event("collective_hang", node, "A", ts, event_id=eid, job_id=JOB, extra=extra)


E41, E7, EB, H_OPEN, H_ALL = (f"00000000-0000-4000-8000-00000000000{i}" for i in range(1, 6))
# rank 41 of job 1234 on n41: late by 250 then 290 ms, resolved at 1200
RANK41 = [
    lag("n41", "A", 1000.0, 41, E41, lag_p50_ms=250.0, lag_p95_ms=300.0, last_count=12),
    lag(
        "n41",
        "A",
        1060.0,
        41,
        E41,
        lag_p50_ms=290.0,
        lag_p95_ms=310.0,
        last_count=14,
        late_count=17,
        peers_wait_p50_ms=280.0,
    ),
    lag("n41", "A", 1200.0, 41, E41, lag_p50_ms=4.0, lag_p95_ms=9.0, last_count=1, state="end"),
]
RANK7 = [lag("n7", "A", 1500.0, 7, E7, lag_p50_ms=40.0, lag_p95_ms=55.0, last_count=6)]
HANGS = [
    # collective 9001: 63 ranks inside for 40 s when seen, rank 41 never entered; still open
    # (the ranks inside listed, as Fleet names the first few and counts them all)
    hang(
        "n41",
        2000.0,
        H_OPEN,
        seq=9001,
        missing_ranks=[41],
        missing_count=1,
        missing_nodes=["n41"],
        inside_ranks=list(range(41)),
        inside_count=63,
        inside_for_s=40.0,
        reason="missing_ranks",
    ),
    # every rank inside collective 8000 (no rank to name), over at 1600
    hang(
        "",
        1500.0,
        H_ALL,
        seq=8000,
        missing_ranks=[],
        missing_nodes=[],
        inside_ranks=64,
        inside_for_s=31.0,
        reason="all_inside",
    ),
    hang(
        "",
        1600.0,
        H_ALL,
        seq=8000,
        # the end, as Fleet sends it: how it ended, and since when the ranks were inside
        reason="collective_returned",
        since=1465.0,
        duration_s=135.0,
        state="end",
    ),
]
SKEW = [
    Event(
        "clock_skew",
        "n41",
        "A",
        1100.0,
        extra={"offset_ms": -25.0, "uncertainty_ms": 2.0, "bound_ms": 10.0, "state": "start"},
    ),
    # a node outside the job, off by more, is not the job's
    Event("clock_skew", "elsewhere", "A", 1100.0, extra={"offset_ms": 900.0, "state": "start"}),
]


def frames(*where: tuple[str, str, int]) -> list[dict[str, Any]]:
    return [{"kind": "py", "function": f, "file": file, "line": line} for f, file, line in where]


LOADER = frames(("read", "data/loader.py", 212), ("__next__", "data/loader.py", 88))
INSIDE = frames(("all_reduce", "torch/distributed/c10d.py", 2050), ("step", "train.py", 141))


def snapshot(node: str, ts: float, eid: str, rank: int, stacks: Any, **fields: Any) -> Event:
    extra = {"trigger": "collective_hang", "for_s": 45.2, "stacks": stacks, **fields}
    return Event("stack_snapshot", node, "A", ts, event_id=eid, job_id=JOB, rank=rank, extra=extra)


SNAPSHOTS = [
    # n41 holds rank 41, the one hang 9001 waits for (its loader thread is the answer), and
    # rank 40, inside the collective (context)
    snapshot(
        "n41",
        2001.0,
        H_OPEN,
        41,
        [
            {"pid": 4100, "rank": 41, "thread": "MainThread", "frames": LOADER},
            {"pid": 4100, "rank": 41, "thread": "pin_memory", "frames": [], "reason": "idle"},
            {"pid": 4000, "rank": 40, "thread": "MainThread", "frames": INSIDE},
        ],
    ),
    # what a broken sender might write: left out of the answer, never a failed one
    snapshot("n7", 2003.0, H_OPEN, 7, [{"frames": "no"}, 5, None]),
    snapshot("n7", 2004.0, H_OPEN, 7, "not a list", for_s="long"),
]
# the same job id in cluster B: a cluster-A token must never see it
BRAVO = [lag("bravo-n3", "B", 1000.0, 3, EB, lag_p50_ms=999.0, lag_p95_ms=999.0, last_count=9)]


def post(echo: EchoProcess, events: list[Event]) -> None:
    body = encode_events(events).SerializeToString()
    status, reply = http(
        "POST", f"http://{echo.otlp_http}/v1/logs", body, TOKEN_OPS, content_type=PROTOBUF
    )
    assert status == 200, reply


def ask(echo: EchoProcess, name: str, token: str = TOKEN_OPS, **params: Any) -> Any:
    return http("GET", f"{echo.url}/api/v1/{name}?{urllib.parse.urlencode(params)}", token=token)


@pytest.fixture(scope="module", autouse=True)
def seeded(echo: EchoProcess) -> None:
    # out of order: rank 41's resolution first, then its start; the re-emit twice (a retry)
    post(echo, [RANK41[2], *RANK7])
    post(echo, [RANK41[0], RANK41[1]])
    post(echo, [RANK41[1]])
    post(echo, [*HANGS, *SKEW, *BRAVO])
    post(echo, SNAPSHOTS)
    post(echo, [straggler("n41", "A", 1000.0, job=JOB), straggler("n41", "A", 1300.0, job=JOB)])


def test_ranks_are_ranked_by_lag_with_the_newest_figures_and_episodes_folded(
    echo: EchoProcess,
) -> None:
    status, body = ask(echo, "collective_lag", job_id=JOB, cluster_id="A", since=0, until=3000)
    assert status == 200, body
    assert body["job_id"] == JOB and body["window"] == {"since": 0.0, "until": 3000.0}
    ranks = body["ranks"]
    assert [(r["node_id"], r["comm_rank"]) for r in ranks] == [("n41", 41), ("n7", 7)]
    r41 = ranks[0]
    # the figures of the newest start event (the re-emit), not of the resolution
    assert (r41["lag_p50_ms"], r41["lag_p95_ms"], r41["times_last"]) == (290.0, 310.0, 14)
    assert (r41["max_lag_p50_ms"], r41["max_lag_p95_ms"]) == (290.0, 310.0)
    assert (r41["times_late"], r41["peers_wait_p50_ms"]) == (17, 280.0)
    assert (r41["episodes"], r41["open_episodes"], r41["closed_episodes"]) == (1, 0, 1)
    assert (r41["first_seen"], r41["last_seen"]) == (1000.0, 1200.0)
    assert (r41["comm_hash"], r41["op"], r41["nranks"], r41["rank"]) == (COMM, "allreduce", 64, 41)
    assert ranks[1]["open_episodes"] == 1 and ranks[1]["max_lag_p50_ms"] == 40.0
    # the resent re-emit was stored once and folded once
    status, rows = http(
        "POST",
        f"{echo.url}/api/v1/sql",
        json.dumps(
            {"query": f"SELECT n_events FROM collective_episodes WHERE event_id = '{E41}'"}
        ).encode(),
        TOKEN_OPS,
    )
    assert status == 200 and rows["rows"] == [[3]]
    # every event is still a row of its own, its extras readable in SQL
    query = (
        "SELECT json_extract(extra, '$.comm_rank'), json_extract(extra, '$.lag_p50_ms')"
        " FROM events WHERE type = 'peer_lag' AND cluster_id = 'A' ORDER BY ts"
    )
    status, rows = http(
        "POST", f"{echo.url}/api/v1/sql", json.dumps({"query": query}).encode(), TOKEN_OPS
    )
    assert rows["rows"] == [[41, 250.0], [41, 290.0], [41, 4.0], [7, 40.0]]
    # limit holds for each list
    one = ask(echo, "collective_lag", job_id=JOB, cluster_id="A", since=0, until=3000, limit=1)[1]
    assert [len(one[k]) for k in ("ranks", "hangs", "clock_skew")] == [1, 1, 1]
    assert one["ranks"][0]["comm_rank"] == 41 and one["hangs"][0]["seq"] == 9001


def test_hung_collectives_name_the_ranks_that_never_entered(echo: EchoProcess) -> None:
    body = ask(echo, "collective_lag", job_id=JOB, since=0, until=3000)[1]
    hangs = [(h["seq"], h["open"], h["missing_ranks"], h["missing_nodes"]) for h in body["hangs"]]
    assert hangs == [(9001, True, [41], ["n41"]), (8000, False, [], [])]
    stuck, all_inside = body["hangs"]
    assert (stuck["since"], stuck["detected"], stuck["ended"]) == (1960.0, 2000.0, None)
    assert (stuck["inside_ranks"], stuck["reason"], stuck["node_id"]) == (
        63,
        "missing_ranks",
        "n41",
    )
    assert (stuck["missing_count"], stuck["end_reason"]) == (1, None)
    # every rank inside: no node named; since = when they went in, from the first sighting
    assert (all_inside["node_id"], all_inside["reason"]) == (None, "all_inside")
    assert (all_inside["since"], all_inside["ended"], all_inside["inside_for_s"]) == (
        1465.0,
        1600.0,
        31.0,
    )
    assert (all_inside["end_reason"], all_inside["missing_count"]) == ("collective_returned", 0)
    skew = body["clock_skew"]
    assert [(n["node_id"], n["offset_ms"], n["max_abs_offset_ms"], n["open"]) for n in skew] == [
        ("n41", -25.0, 25.0, True)
    ]
    # a window before everything has nothing
    empty = ask(echo, "collective_lag", job_id=JOB, since=0, until=10)[1]
    assert (empty["ranks"], empty["hangs"], empty["clock_skew"]) == ([], [], [])


def test_stragglers_and_job_report_carry_the_nccl_side(echo: EchoProcess) -> None:
    ranked = ask(echo, "stragglers", cluster_id="A", job_id=JOB, since=0, until=3000)[1]
    n41 = next(r for r in ranked["stragglers"] if r["node_id"] == "n41")
    assert (n41["peer_lag_ms"], n41["collective_hangs"]) == (290.0, 1)
    # the window ends before the hang: the lag is there, the hang is not
    early = ask(echo, "stragglers", cluster_id="A", job_id=JOB, since=0, until=1400)[1]
    assert [(r["peer_lag_ms"], r["collective_hangs"]) for r in early["stragglers"]] == [(290.0, 0)]
    report = ask(echo, "job_report", job_id=JOB, cluster_id="A")[1]
    assert len(report["collective_hangs"]) == 3 and len(report["peer_lag"]) == 4
    assert [r["comm_rank"] for r in report["lagging_ranks"]] == [41, 7]
    assert report["answers"] == [ANSWER]
    assert [s["node_id"] for s in report["stack_snapshots"]] == ["n7", "n7", "n41"]


ANSWER = (
    "the job is hung in allreduce #9001; rank 41 on n41 has been in read at"
    " data/loader.py:212 ← __next__ at data/loader.py:88 for 45 s"
)


def test_the_missing_rank_stack_is_the_answer_the_waiting_ones_context(
    echo: EchoProcess,
) -> None:
    body = ask(echo, "collective_lag", job_id=JOB, since=0, until=3000)[1]
    stuck, all_inside = body["hangs"]
    assert stuck["answer"] == ANSWER
    roles = [(s["node_id"], s["rank"], s["thread"], s["role"]) for s in stuck["stacks"]]
    assert roles == [
        ("n41", 41, "MainThread", "missing"),
        ("n41", 41, "pin_memory", "missing"),
        ("n41", 40, "MainThread", "waiting"),
    ]
    assert stuck["stacks"][0]["frames"] == LOADER  # frames kept as structure
    assert stuck["stacks"][2]["summary"].startswith("all_reduce at torch/distributed/c10d.py")
    assert (all_inside["answer"], all_inside["stacks"]) == (None, [])
    # the broken ones are listed with what could be read of them: nothing
    broken = [s for s in body["stack_snapshots"] if s["timestamp"] in (2003.0, 2004.0)]
    assert [(s["stacks"], s["for_s"]) for s in broken] == [([], None), ([], 45.2)]


def test_a_token_of_another_cluster_sees_nothing_of_it(echo: EchoProcess) -> None:
    status, body = ask(echo, "collective_lag", TOKEN_B, job_id=JOB, since=0, until=3000)
    assert status == 200
    assert [(r["cluster_id"], r["node_id"]) for r in body["ranks"]] == [("B", "bravo-n3")]
    assert body["hangs"] == [] and body["clock_skew"] == []
    status, denied = ask(echo, "collective_lag", TOKEN_B, job_id=JOB, cluster_id="A")
    assert status == 403 and "no access to cluster 'A'" in denied["error"]
    text = json.dumps(ask(echo, "collective_lag", TOKEN_A, job_id=JOB, since=0, until=3000)[1])
    assert "bravo" not in text and '"B"' not in text
    status, bad = ask(echo, "collective_lag", since=0)
    assert status == 400 and bad["error"] == "parameter job_id is required"


async def _mcp(echo: EchoProcess) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {TOKEN_A}"}
    transport = streamable_http_client(
        f"{echo.url}/mcp", http_client=httpx2.AsyncClient(headers=headers)
    )
    out: dict[str, Any] = {}
    async with Client(transport) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        out["schema"] = tools["collective_lag"].input_schema
        args = {"job_id": JOB, "since": 0, "until": 3000}
        out["answer"] = (await c.call_tool("collective_lag", args)).structured_content
        prompt = await c.get_prompt("investigate", {"cluster_id": "A", "job_id": JOB})
        out["prompt"] = prompt.messages[0].content.text  # type: ignore[union-attr]
        denied = await c.call_tool("collective_lag", {"job_id": JOB, "cluster_id": "B"})
        out["denied"] = (denied.is_error, denied.content[0].text)  # type: ignore[union-attr]
    return out


def test_the_official_mcp_client_gets_the_same_answer_and_the_prompt_asks_for_it(
    echo: EchoProcess,
) -> None:
    out = anyio.run(_mcp, echo)
    assert out["schema"]["required"] == ["job_id"]
    over_http = ask(echo, "collective_lag", TOKEN_A, job_id=JOB, since=0, until=3000)[1]
    assert out["answer"] == over_http and out["answer"]["ranks"]
    assert f'`collective_lag` with {{"job_id": "{JOB}"}}' in out["prompt"]
    assert out["denied"][0] and "no access to cluster 'B'" in out["denied"][1]


def test_the_openapi_document_describes_the_question(echo: EchoProcess) -> None:
    status, doc = http("GET", f"{echo.url}/api/v1/openapi.json")
    assert status == 200
    validate(doc)
    op = doc["paths"]["/api/v1/collective_lag"]["get"]
    assert {p["name"] for p in op["parameters"] if p["required"]} == {"job_id"}
    answer = op["responses"]["200"]["content"]["application/json"]["schema"]
    assert set(answer["required"]) >= {"ranks", "hangs", "clock_skew", "truncated"}
