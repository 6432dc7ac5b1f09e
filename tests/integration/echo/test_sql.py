"""Read-only SQL against a real store: escape attempts fail, limits hold, tenants are fenced."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ingero.echo.auth import Principal
from ingero.echo.sql import SqlError, connect_scoped, run_sql
from ingero.echo.store import Store

from .helpers import straggler

pytestmark = pytest.mark.integration

OPS = Principal("ops")
TENANT_A = Principal("tenant-a", frozenset({"A"}))
MAX_BYTES = 1_000_000


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


def sql(db: Path, query: str, who: Principal = OPS, **kw: Any) -> dict[str, Any]:
    return run_sql(db, query, who, **{"max_bytes": MAX_BYTES, **kw})


def rows(db: Path, query: str, who: Principal = OPS, **kw: Any) -> list[list[object]]:
    return sql(db, query, who, **kw)["rows"]  # type: ignore[no-any-return]


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
            sql(db, query, who)
    assert rows(db, "SELECT count(*) FROM events") == [[12]]
    assert not Path("/tmp/echo-copy.db").exists()


def test_reads_work_and_rows_are_capped(db: Path) -> None:
    result = sql(db, "SELECT node_id FROM events ORDER BY node_id", OPS, max_rows=3)
    assert result["rows"] == [["a0"], ["a1"], ["a2"]] and result["truncated"] is True
    assert result["columns"] == ["node_id"]
    assert rows(db, "SELECT count(*) FROM episodes") == [[12]]
    assert rows(db, "SELECT name FROM sqlite_master WHERE name = 'events'") == [["events"]]
    assert rows(db, "SELECT 1e308 * 10, -1e308 * 10, x'00ff'") == [[None, None, "AP8="]]


def test_a_runaway_query_is_stopped_by_the_time_limit(db: Path) -> None:
    query = "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c) SELECT max(i) FROM c"
    with pytest.raises(SqlError, match=r"longer than 0\.3s"):
        sql(db, query, OPS, timeout=0.3)


def test_huge_values_are_refused(db: Path) -> None:
    with pytest.raises(SqlError, match="too big"):
        sql(db, "SELECT length(randomblob(500000000))", OPS)


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
        with pytest.raises(SqlError, match="no such table: main"):
            sql(db, query, TENANT_A)
    # the operator's unscoped token still sees everything
    assert rows(db, "SELECT count(*) FROM main.events") == [[12]]


def test_bad_sql_is_a_clear_error(db: Path) -> None:
    for query, message in [
        ("", "empty"),
        ("SELEKT 1", "syntax error"),
        ("SELECT nope FROM events", "no such column"),
    ]:
        with pytest.raises(SqlError, match=message):
            sql(db, query, OPS)


def test_the_store_is_attached_under_a_new_name_for_every_request(db: Path) -> None:
    """A scoped connection's main database is empty and the store's name is drawn anew,
    so another request's name (as if it had leaked) reaches nothing in this one."""
    conn, leaked = connect_scoped(db, {"A"})
    try:
        other, second = connect_scoped(db, {"A"})
        other.close()
        assert leaked != second
        assert conn.execute("SELECT count(*) FROM main.sqlite_master").fetchone() == (0,)
        # on its own connection, and without the authorizer, the name reaches every row
        assert conn.execute(f"SELECT count(*) FROM {leaked}.events").fetchone() == (12,)
    finally:
        conn.close()
    with pytest.raises(SqlError, match="no such table"):
        sql(db, f"SELECT node_id FROM {leaked}.events", TENANT_A)


def test_the_stores_other_tables_are_hidden_behind_empty_ones(db: Path) -> None:
    """A bare name that nothing shadowed would find the store's table, and SQLite never
    asks the authorizer about the columns of a NATURAL join."""
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE notes (cluster_id TEXT, note TEXT)")
        conn.execute("INSERT INTO notes VALUES ('B', 'bravo secret')")
    conn.close()
    natural = "SELECT note FROM (SELECT NULL AS note WHERE 0) NATURAL FULL JOIN notes"
    assert rows(db, natural) == [["bravo secret"]]  # the operator's
    for query in (natural, "SELECT note FROM notes", "SELECT count(*) FROM notes"):
        with pytest.raises(SqlError, match=r"no such column|refused"):
            sql(db, query, TENANT_A)
    # SQLite's own tables cannot be shadowed by views: main has empty ones of its own
    with sqlite3.connect(db) as conn:
        conn.execute("ANALYZE")
    conn.close()
    stats = "SELECT tbl, stat FROM (SELECT NULL AS tbl, NULL AS stat WHERE 0) NATURAL FULL JOIN"
    assert "events" in json.dumps(rows(db, f"{stats} sqlite_stat1"))  # the store's row counts
    assert "events" not in json.dumps(rows(db, f"{stats} sqlite_stat1", TENANT_A))


def test_the_answer_stops_at_its_byte_limit_with_the_reason(db: Path) -> None:
    query = "SELECT node_id, zeroblob(3000) FROM events ORDER BY node_id"
    whole = sql(db, query, max_bytes=10**6)
    assert (whole["row_count"], whole["truncated"], whole["truncated_reason"]) == (12, False, None)
    cut = sql(db, query, max_bytes=20_000)
    assert (cut["truncated"], cut["truncated_reason"]) == (True, "bytes")
    assert cut["rows"] == whole["rows"][: cut["row_count"]] and 0 < cut["row_count"] < 12
    assert len(json.dumps(cut["rows"], separators=(",", ":"))) <= 20_000
    assert sql(db, "SELECT node_id FROM events", max_rows=3)["truncated_reason"] == "rows"
    # one value over the limit is refused, as values over 1 MB always were
    with pytest.raises(SqlError, match="too big"):
        sql(db, "SELECT zeroblob(30000)", max_bytes=20_000)


def test_rows_past_the_time_limit_are_an_answer_cut_by_time(db: Path) -> None:
    """A query that keeps finding rows slowly answers with those it found in time."""
    query = (
        "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c)"
        " SELECT i FROM c WHERE i % 10000 = 1"
    )
    result = sql(db, query, timeout=1.0)
    assert result["rows"][0] == [1] and result["truncated_reason"] == "time"
