"""A token scoped to cluster A reads only cluster A through read-only SQL, whatever the query
calls things: a table of escape attempts against the real daemon, through both front doors
(``POST /api/v1/sql`` and the MCP ``sql`` tool over streamable HTTP, official client).

Each attempt names what it must get: ``NO`` (a clear one-line error: 400, or a tool error),
``A`` (rows, none of cluster B) or ``NONE`` (an answer without rows). Cluster B's rows are in every table, marked ``bravo…``,
so a leak of rows shows in the answer; an attempt that would leak only a count must be NO.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx2
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from ingero.otlp.health import NodePush, encode_health
from ingero.otlp.logs import encode_events

from .helpers import TOKEN_A, TOKEN_OPS, EchoProcess, http, straggler

pytestmark = pytest.mark.integration

PROTOBUF = "application/x-protobuf"
TABLES = ("events", "episodes", "scores", "nodes", "collective_episodes")
NO, A, NONE = "no", "A", "none"


def _per_table(t: str) -> list[tuple[str, str]]:
    cols = "cluster_id, node_id"
    return [
        # CTE shadowing: the name the old authorizer trusted
        (f"WITH {t} AS (SELECT * FROM main.{t}) SELECT {cols} FROM {t}", NO),
        (f"WITH {t} AS MATERIALIZED (SELECT * FROM main.{t}) SELECT {cols} FROM {t}", NO),
        (f"WITH RECURSIVE {t} AS (SELECT * FROM main.{t}) SELECT {cols} FROM {t}", NO),
        (
            f"WITH RECURSIVE {t}(c, n) AS (SELECT {cols} FROM main.{t}"
            f" UNION SELECT c, n FROM {t} WHERE 0) SELECT c, n FROM {t}",
            NO,
        ),
        (
            f"WITH {t} AS (SELECT * FROM temp.{t}), x AS (SELECT * FROM main.{t})"
            f" SELECT {cols} FROM x",
            NO,
        ),
        (
            f'WITH "{t.upper()}" AS (SELECT * FROM MAIN."{t.title()}") SELECT {cols} FROM {t}',
            NO,
        ),
        # a CTE inside a subquery, named like the table, reading it qualified
        (f"SELECT * FROM (WITH {t} AS (SELECT * FROM main.{t}) SELECT {cols} FROM {t})", NO),
        # plain qualification, subqueries, UNION, aggregates, comments
        (f"SELECT {cols} FROM main.{t}", NO),
        (f'SELECT {cols} FROM "main"."{t}"', NO),
        (f"SELECT {cols} FROM [main].[{t}]", NO),
        (f"SELECT {cols} FROM MaIn.{t.upper()}", NO),
        (f"SELECT {cols} FROM main/**/.{t}", NO),
        (f"SELECT {cols} FROM main--\n.{t}", NO),
        (f"SELECT count(*) FROM main.{t}", NO),
        (f"SELECT (SELECT group_concat(cluster_id || node_id) FROM main.{t})", NO),
        (f"SELECT {cols} FROM (SELECT {cols} FROM main.{t}) AS {t}", NO),
        (f"SELECT {cols} FROM {t} UNION ALL SELECT {cols} FROM main.{t}", NO),
        (f"SELECT {cols} FROM {t} WHERE node_id IN (SELECT node_id FROM main.{t})", NO),
        # columns SQLite adds for USING and NATURAL joins are never shown to the authorizer
        (
            f"SELECT {cols} FROM (SELECT NULL AS cluster_id, NULL AS node_id WHERE 0)"
            f" NATURAL FULL JOIN main.{t}",
            NO,
        ),
        (f"SELECT count(*) FROM (SELECT 'B' AS cluster_id) JOIN main.{t} USING (cluster_id)", NO),
        (
            f"SELECT {cols} FROM (SELECT NULL AS cluster_id, NULL AS node_id WHERE 0)"
            f" NATURAL FULL JOIN {t}",
            A,
        ),
        # what a tenant may do: its own rows, named any way that reaches the scoped view
        (f"SELECT {cols} FROM {t}", A),
        (f"SELECT {cols} FROM temp.{t}", A),
        (f'SELECT {cols} FROM "{t.upper()}"', A),
        (f"WITH mine AS (SELECT * FROM {t}) SELECT {cols} FROM mine", A),
        (f"WITH {t} AS (SELECT * FROM {t}) SELECT {cols} FROM {t}", NO),  # circular
        (f"SELECT {cols} FROM {t} /* main.{t} */ -- UNION SELECT {cols} FROM main.{t}", A),
    ]


ATTEMPTS: list[tuple[str, str]] = [
    *(a for t in TABLES for a in _per_table(t)),
    # CTEs named after another table and the schema table; guesses at the store's name
    ("WITH scores AS (SELECT * FROM main.events) SELECT cluster_id, node_id FROM scores", NO),
    (
        "WITH sqlite_master AS (SELECT * FROM main.events) SELECT node_id FROM sqlite_master",
        NO,
    ),
    ("SELECT cluster_id, node_id FROM store.events", NO),
    ("SELECT cluster_id, node_id FROM store_00000000000000000000000000000000.events", NO),
    ("SELECT cluster_id, node_id FROM echo.events", NO),
    # subqueries that test for other clusters' rows without returning them
    (
        "SELECT cluster_id, node_id FROM events"
        " WHERE EXISTS (SELECT 1 FROM main.events m WHERE m.cluster_id = 'B')",
        NO,
    ),
    ("SELECT rowid, node_id FROM main.events", NO),
    (
        "SELECT key, value FROM json_each((SELECT json_group_array(node_id) FROM main.events))",
        NO,
    ),
    # views cannot be made
    ("CREATE TEMP VIEW v AS SELECT * FROM main.events", NO),
    ("CREATE VIEW v AS SELECT * FROM main.events", NO),
    ("DROP VIEW events", NO),
    # the schema: a tenant's main database is empty; TEMP's names where the store is
    ("SELECT type, name, sql FROM sqlite_master", NONE),
    ("SELECT name, sql FROM main.sqlite_schema", NONE),
    ("SELECT name, sql FROM temp.sqlite_master", NO),
    ("SELECT name, sql FROM sqlite_temp_master", NO),
    ("SELECT name, sql FROM sqlite_temp_schema", NO),
    ("SELECT count(*) FROM temp.sqlite_master", NO),
    # the TEMP schema table through a NATURAL join: it shows the name the store is attached
    # under, after the query was written (so no query can use it)
    (
        "SELECT name, sql FROM (SELECT NULL AS name, NULL AS sql WHERE 0)"
        " NATURAL FULL JOIN sqlite_temp_master",
        A,
    ),
    (
        "SELECT name, file FROM (SELECT NULL AS name, NULL AS file WHERE 0)"
        " NATURAL FULL JOIN pragma_database_list",
        NO,
    ),
    (
        "SELECT name, ncell FROM (SELECT NULL AS name, NULL AS ncell WHERE 0)"
        " NATURAL FULL JOIN dbstat",
        NO,
    ),
    # pragma table-valued functions, raw pages and statistics
    ("SELECT * FROM pragma_table_info('events')", NO),
    ("SELECT * FROM main.pragma_index_list('events')", NO),
    ("SELECT * FROM pragma_database_list", NO),
    ("SELECT * FROM pragma_compile_options", NO),
    ("PRAGMA table_info(events)", NO),
    ("SELECT * FROM sqlite_dbpage", NO),
    ("SELECT * FROM dbstat", NO),
    ("SELECT * FROM sqlite_stat1", NO),
    # window functions
    ("SELECT cluster_id, node_id, count(*) OVER () FROM events", A),
    (
        "SELECT cluster_id, node_id, count(*) OVER w FROM events"
        " WINDOW w AS (PARTITION BY cluster_id)",
        A,
    ),
    ("SELECT cluster_id, node_id, lag(node_id) OVER (ORDER BY ts) FROM main.events", NO),
    (
        "WITH events AS (SELECT * FROM main.events)"
        " SELECT cluster_id, node_id, row_number() OVER () FROM events",
        NO,
    ),
    # unicode and case: SQLite folds ASCII case only
    ("SELECT cluster_id, node_id FROM EvEnTs", A),
    (
        "WITH \uff45vents AS (SELECT * FROM main.events) SELECT cluster_id, node_id FROM \uff45vents",
        NO,
    ),
    (
        'WITH "évents" AS (SELECT * FROM main.events) SELECT cluster_id, node_id FROM "évents"',
        NO,
    ),
    ('SELECT cluster_id, node_id FROM main."\uff45vents"', NO),
    ('SELECT cluster_id, node_id FROM "events\u200b"', NO),
    # comments and more than one statement
    ("/* events */ WITH events AS (SELECT * FROM main.events) SELECT node_id FROM events", NO),
    ("SELECT node_id FROM events; SELECT node_id FROM main.events", NO),
    ("SELECT node_id FROM events; -- \n DROP VIEW events", NO),
    ("ATTACH DATABASE ':memory:' AS m", NO),
    # the plan names the store's attached (per-request) name: refused for tenants
    ("EXPLAIN QUERY PLAN SELECT * FROM events", NO),
    ("/* x */ -- y\n explain SELECT * FROM events", NO),
    ("EXPLAIN SELECT * FROM episodes", NO),
]


def _leaks(rows: list[list[Any]]) -> bool:
    """Any value of cluster B (its id, or a node of it: bravo…)."""
    return any(v == "B" or (isinstance(v, str) and "bravo" in v) for row in rows for v in row)


def _check(query: str, expect: str, ok: bool, rows: list[list[Any]], error: str) -> str | None:
    """What is wrong with one answer, or None."""
    if ok and _leaks(rows):
        return f"cluster B leaked: {json.dumps(rows)[:300]}"
    if expect in (A, NONE):
        if not ok:
            return f"refused a legitimate read: {error}"
        if (expect == A) != bool(rows):
            return f"expected {'rows' if expect == A else 'no rows'}, got {len(rows)}"
        return None
    if ok:
        return f"expected an error, got rows {json.dumps(rows)[:300]}"
    if not error.strip() or "\n" in error.strip():
        return f"the error is not one clear line: {error!r}"
    return None


@pytest.fixture(scope="module", autouse=True)
def seeded(echo: EchoProcess) -> None:
    """Both clusters in every table: events, episodes (an opened and a resolved one),
    NCCL episodes (a peer_lag event), nodes (from events), scores (from health pushes)."""
    events = []
    for cluster, prefix in (("A", "alpha"), ("B", "bravo")):
        for i in range(3):
            node = f"{prefix}{i}"
            events.append(
                straggler(node, cluster, 1000.0 + i, gpu_model="NVIDIA H100", gpu_count=8)
            )
        events.append(straggler(f"{prefix}0", cluster, 1100.0, kind="straggler_resolved"))
        events.append(
            straggler(f"{prefix}1", cluster, 1200.0, kind="peer_lag", comm_rank=1, lag_p50_ms=9.0)
        )
    url = f"http://{echo.otlp_http}/v1/logs"
    status, body = http("POST", url, encode_events(events).SerializeToString(), TOKEN_OPS, PROTOBUF)
    assert status == 200, body
    scores = ExportMetricsServiceRequest()
    for cluster, prefix in (("A", "alpha"), ("B", "bravo")):
        for i in range(3):
            push = NodePush(node_id=f"{prefix}{i}", cluster_id=cluster, score=0.5)
            scores.resource_metrics.extend(encode_health(push, 10_000 * 10**9).resource_metrics)
    url = f"http://{echo.otlp_http}/v1/metrics"
    status, body = http("POST", url, scores.SerializeToString(), TOKEN_OPS, PROTOBUF)
    assert status == 200, body
    for table in TABLES:  # the operator sees both clusters in every table
        status, body = _http_sql(
            echo, f"SELECT DISTINCT cluster_id FROM {table} ORDER BY 1", TOKEN_OPS
        )
        assert (status, body["rows"]) == (200, [["A"], ["B"]]), table


def _http_sql(echo: EchoProcess, query: str, token: str) -> tuple[int, Any]:
    return http("POST", f"{echo.url}/api/v1/sql", json.dumps({"query": query}).encode(), token)


def test_every_table_of_the_schema_is_in_the_attempts(echo: EchoProcess) -> None:
    status, body = _http_sql(echo, "SELECT name FROM sqlite_master WHERE type = 'table'", TOKEN_OPS)
    assert status == 200 and sorted(r[0] for r in body["rows"]) == sorted(TABLES)


def test_escape_attempts_over_http(echo: EchoProcess) -> None:
    wrong = []
    for query, expect in ATTEMPTS:
        status, body = _http_sql(echo, query, TOKEN_A)
        assert status in (200, 400), (query, status, body)
        ok = status == 200
        problem = _check(query, expect, ok, body.get("rows", []), body.get("error", ""))
        if problem:
            wrong.append(f"{query!r}: {problem}")
    assert not wrong, "\n".join(wrong)


async def _mcp_sql(url: str, queries: list[str]) -> list[tuple[bool, Any, str]]:
    headers = {"Authorization": f"Bearer {TOKEN_A}"}
    transport = streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers))
    out = []
    async with Client(transport) as client:
        for query in queries:
            result = await client.call_tool("sql", {"query": query})
            text = result.content[0].text if result.content else ""  # type: ignore[union-attr]
            out.append((not result.is_error, result.structured_content, text))
    return out


def test_escape_attempts_over_the_mcp_sql_tool(echo: EchoProcess) -> None:
    answers = anyio.run(_mcp_sql, f"{echo.url}/mcp", [q for q, _ in ATTEMPTS])
    wrong = []
    for (query, expect), (ok, structured, text) in zip(ATTEMPTS, answers, strict=True):
        rows = (structured or {}).get("rows", []) if ok else []
        problem = _check(query, expect, ok, rows, "" if ok else text)
        if problem:
            wrong.append(f"{query!r}: {problem}")
    assert not wrong, "\n".join(wrong)


def test_the_operator_still_reads_everything(echo: EchoProcess) -> None:
    for query in (
        "SELECT DISTINCT cluster_id FROM main.events ORDER BY 1",
        "WITH events AS (SELECT * FROM main.events) SELECT DISTINCT cluster_id FROM events"
        " ORDER BY 1",
        "SELECT cluster_id FROM scores UNION SELECT cluster_id FROM nodes ORDER BY 1",
    ):
        status, body = _http_sql(echo, query, TOKEN_OPS)
        assert (status, body["rows"]) == (200, [["A"], ["B"]]), (query, body)
