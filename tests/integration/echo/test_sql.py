"""Read-only SQL against a real store: escape attempts fail, limits hold, tenants are fenced."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ingero.echo.auth import Principal
from ingero.echo.sql import SqlError, run_sql
from ingero.echo.store import Store

from .helpers import straggler

pytestmark = pytest.mark.integration

OPS = Principal("ops")
TENANT_A = Principal("tenant-a", frozenset({"A"}))


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Path]:
    store = Store(tmp_path / "e.db")
    try:
        store.write(
            [straggler(f"a{i}", "A", 100.0 + i) for i in range(5)]
            + [straggler(f"b{i}", "B", 100.0 + i) for i in range(7)]
        )
        yield store.path
    finally:
        store.close()


def rows(db: Path, query: str, who: Principal = OPS, **kw: object) -> list[list[object]]:
    return run_sql(db, query, who, **kw)["rows"]  # type: ignore[arg-type,no-any-return]


ESCAPES = [
    "INSERT INTO events (event_id, type, cluster_id, node_id, ts, received) VALUES ('x','t','A','n',1,1)",
    "UPDATE events SET cluster_id = 'A'",
    "DELETE FROM events",
    "DROP TABLE events",
    "CREATE TABLE evil (x)",
    "CREATE TEMP TABLE evil (x)",
    "CREATE TEMP VIEW v AS SELECT * FROM events",
    "ATTACH DATABASE '/tmp/evil.db' AS evil",
    "ATTACH DATABASE ':memory:' AS m",
    "DETACH DATABASE main",
    "PRAGMA writable_schema = 1",
    "PRAGMA journal_mode = DELETE",
    "PRAGMA query_only = 0",
    "PRAGMA user_version = 99",
    "PRAGMA table_info(events)",
    "SELECT load_extension('/tmp/evil.so')",
    "VACUUM",
    "VACUUM INTO '/tmp/echo-copy.db'",
    "REINDEX",
    "ANALYZE",
    "BEGIN",
    "SAVEPOINT s",
    "SELECT 1; DELETE FROM events",
    "WITH x AS (SELECT 1) DELETE FROM events",
    "REPLACE INTO nodes (cluster_id, node_id) VALUES ('A', 'n')",
    "SELECT * FROM sqlite_temp_master; DROP VIEW events",
]


@pytest.mark.parametrize("query", ESCAPES)
def test_escape_attempts_are_refused_and_change_nothing(db: Path, query: str) -> None:
    for who in (OPS, TENANT_A):
        with pytest.raises(SqlError):
            run_sql(db, query, who)
    assert rows(db, "SELECT count(*) FROM events") == [[12]]
    assert not Path("/tmp/echo-copy.db").exists()


def test_reads_work_and_rows_are_capped(db: Path) -> None:
    result = run_sql(db, "SELECT node_id FROM events ORDER BY node_id", OPS, max_rows=3)
    assert result["rows"] == [["a0"], ["a1"], ["a2"]] and result["truncated"] is True
    assert result["columns"] == ["node_id"]
    assert rows(db, "SELECT count(*) FROM episodes") == [[12]]
    assert rows(db, "SELECT name FROM sqlite_master WHERE name = 'events'") == [["events"]]
    assert rows(db, "SELECT 1e308 * 10, -1e308 * 10, x'00ff'") == [[None, None, "AP8="]]


def test_a_runaway_query_is_stopped_by_the_time_limit(db: Path) -> None:
    query = "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c) SELECT max(i) FROM c"
    with pytest.raises(SqlError, match=r"longer than 0\.3s"):
        run_sql(db, query, OPS, timeout=0.3)


def test_huge_values_are_refused(db: Path) -> None:
    with pytest.raises(SqlError, match="too big"):
        run_sql(db, "SELECT length(randomblob(500000000))", OPS)


def test_a_tenant_sees_only_its_clusters_through_every_table(db: Path) -> None:
    assert rows(db, "SELECT DISTINCT cluster_id FROM events", TENANT_A) == [["A"]]
    for table in ("events", "episodes", "nodes"):
        assert rows(db, f"SELECT count(*) FROM {table} WHERE cluster_id = 'B'", TENANT_A) == [[0]]
        assert rows(db, f"SELECT count(*) FROM temp.{table}", TENANT_A) == [[5]]
    for query in (
        "SELECT count(*) FROM main.events",
        "SELECT node_id FROM main.events WHERE cluster_id = 'B'",
        "SELECT * FROM main.nodes",
        "SELECT (SELECT count(*) FROM main.episodes)",
        "SELECT e.node_id FROM events e JOIN main.events m ON m.id = e.id",
    ):
        with pytest.raises(SqlError, match="refused"):
            run_sql(db, query, TENANT_A)
    # the operator's unscoped token still sees everything
    assert rows(db, "SELECT count(*) FROM main.events") == [[12]]


def test_bad_sql_is_a_clear_error(db: Path) -> None:
    for query, message in [
        ("", "empty"),
        ("SELEKT 1", "syntax error"),
        ("SELECT nope FROM events", "no such column"),
    ]:
        with pytest.raises(SqlError, match=message):
            run_sql(db, query, OPS)
