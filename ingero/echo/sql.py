"""Read-only, bounded SQL over the event store.

The walls (``ingero.sqlite.sqlguard``): the store is opened ``mode=ro`` (SQLite itself refuses
writes) and the connection set ``query_only``; an authorizer allows only SELECT, reads and ordinary
functions, refusing writes, DDL, ATTACH/DETACH, every PRAGMA and ``load_extension``; a
progress handler stops a query past its time limit, and the answer stops at its row limit
and at its byte limit (counted as JSON while rows are fetched); values and rows are capped
in size.

Tenancy rests on what a scoped token's connection can reach, not on the authorizer (which
SQLite does not consult for the columns of USING and NATURAL joins, and which is told CTE
names as if they were views). Its main database is a private, empty one; the store is
attached read-only under a name drawn at random for each request, after the query text is
fixed; TEMP views named after the tables hold only the token's clusters' rows. A table of
the store can be named only by that schema name (any other table name finds a view, or
nothing), which the query cannot contain but by guessing 128 random bits.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
from collections.abc import Collection
from pathlib import Path
from typing import Any

from ingero.echo.auth import Principal
from ingero.echo.questions import TRUNCATION_SCHEMA
from ingero.echo.schema import TENANT_TABLES
from ingero.echo.store import connect_readonly
from ingero.sqlite.sqlguard import (
    SqlError,
    check_query_text,
    read_only_authorizer,
    run_bounded,
)

__all__ = ["SQL_OUTPUT_SCHEMA", "SqlError", "run_sql"]

SQL_OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "columns": {"type": "array", "items": {"type": "string"}},
        "rows": {"type": "array", "items": {"type": "array"}},
        "row_count": {"type": "integer"},
        **TRUNCATION_SCHEMA,
        "tables": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["columns", "rows", "row_count", "truncated", "truncated_reason", "tables"],
}


def _quote(value: str, mark: str = "'") -> str:
    return mark + value.replace(mark, mark * 2) + mark


def connect_scoped(
    db_path: str | os.PathLike[str], clusters: Collection[str]
) -> tuple[sqlite3.Connection, str]:
    """A connection whose only way to the store is views of ``clusters``' rows; returns it
    and the (secret) name the store is attached under."""
    store = f"store_{secrets.token_hex(16)}"
    conn = sqlite3.connect("file::memory:", uri=True, check_same_thread=False)
    try:
        conn.execute(
            f"ATTACH DATABASE ? AS {store}", (Path(db_path).resolve().as_uri() + "?mode=ro",)
        )
        allowed = ",".join(_quote(c) for c in sorted(clusters)) or "NULL"
        for table in TENANT_TABLES:
            conn.execute(
                f"CREATE TEMP VIEW {table} AS SELECT * FROM {store}.{table}"
                f" WHERE cluster_id IN ({allowed})"
            )
        # A bare name finds TEMP, then main, then the store: any other table of the store
        # (none today) gets an empty view of its name in front of it, and SQLite's own
        # (sqlite_stat1 after an ANALYZE, sqlite_sequence), which no view may be named
        # after, empty ones of main's own.
        names = conn.execute(
            f"SELECT name FROM {store}.sqlite_master WHERE type IN ('table', 'view')"
        ).fetchall()
        internal = False
        for (name,) in names:
            if name.lower() in TENANT_TABLES:
                continue
            if name.lower().startswith("sqlite_"):
                internal = True
                continue
            hidden = _quote(name, '"')
            conn.execute(f"CREATE TEMP VIEW {hidden} AS SELECT NULL AS hidden WHERE 0")
        if internal:
            conn.execute("CREATE TABLE main.hidden (x INTEGER PRIMARY KEY AUTOINCREMENT)")
            conn.execute("CREATE INDEX main.hidden_x ON hidden (x)")
            conn.execute("ANALYZE main")
    except BaseException:
        conn.close()
        raise
    return conn, store


def _first_word(query: str) -> str:
    """The statement's first keyword, lower-case, past white space and SQL comments."""
    text = query.lstrip()
    while text.startswith(("--", "/*")):
        if text.startswith("--"):
            _, _, text = text.partition("\n")
        else:
            _, _, text = text[2:].partition("*/")
        text = text.lstrip()
    word = ""
    for ch in text:
        if not (ch.isalnum() or ch == "_"):
            break
        word += ch
    return word.lower()


def run_sql(
    db_path: str | os.PathLike[str],
    query: str,
    principal: Principal,
    *,
    max_bytes: int,
    max_rows: int = 10_000,
    timeout: float = 5.0,
) -> dict[str, Any]:
    """Run one read-only statement; returns columns, rows and whether (why) they were cut."""
    check_query_text(query)
    store = None
    if principal.clusters is None:
        conn = connect_readonly(db_path)
    else:
        if _first_word(query) == "explain":
            # EXPLAIN QUERY PLAN prints the store's attached name. That name is drawn anew
            # for every request, so it is no key to another one, but a tenant has no need
            # of the plan and the name is a wall's secret: keep it out of every answer.
            raise SqlError("refused: EXPLAIN is for unscoped tokens (it shows the store's layout)")
        conn, store = connect_scoped(db_path, principal.clusters)
    try:
        result = run_bounded(
            conn,
            query,
            read_only_authorizer(TENANT_TABLES, scoped_store=store),
            max_rows=max_rows,
            timeout=timeout,
            refused_hint="Echo's SQL is read-only and limited to its tables",
            max_bytes=max_bytes,
        )
    finally:
        conn.close()
    return {
        "columns": result.columns,
        "rows": result.rows,
        "row_count": len(result.rows),
        "truncated": result.truncated,
        "truncated_reason": result.truncated_reason,
        "tables": list(TENANT_TABLES),
    }
