"""Read-only, bounded SQL over the event store.

The walls (``ingero.sqlguard``): the connection is opened ``mode=ro`` (SQLite itself refuses
writes) and set ``query_only``; an authorizer allows only SELECT, reads and ordinary
functions, refusing writes, DDL, ATTACH/DETACH, every PRAGMA and ``load_extension``; a
progress handler stops a query past its time limit, and the answer stops at its row limit
and at its byte limit (counted as JSON while rows are fetched); values and rows are capped
in size.

Tenancy: for a token scoped to clusters, each table is shadowed by a TEMP view of the same
name, which reads a second TEMP view holding only the allowed clusters' rows. That inner
view's name is drawn at random for each request, after the query text is fixed, and the
authorizer lets a table of ``main`` be read only from inside the view of that name
(``read_only_authorizer(guards=...)``). So neither ``main.events`` nor a CTE that reads it
(whatever the CTE is called) reaches another cluster's rows: it would have to name the
inner view, which it cannot know.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
from collections.abc import Collection
from typing import Any

from ingero.echo.auth import Principal
from ingero.echo.queries import TRUNCATION_SCHEMA
from ingero.echo.schema import TENANT_TABLES
from ingero.echo.store import connect_readonly
from ingero.sqlguard import (
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


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def scope_to_clusters(conn: sqlite3.Connection, clusters: Collection[str]) -> dict[str, str]:
    """Create the TEMP views of a scoped connection; returns table -> its guard view's name."""
    nonce = secrets.token_hex(16)  # 128 bits: a query cannot name the guard but by luck
    allowed = ",".join(_quote(c) for c in sorted(clusters)) or "NULL"
    conn.execute("PRAGMA query_only = 0")  # the TEMP views only; main stays mode=ro
    guards: dict[str, str] = {}
    for table in TENANT_TABLES:
        guard = f"scoped_{table}_{nonce}"
        conn.execute(
            f"CREATE TEMP VIEW {guard} AS SELECT * FROM main.{table}"
            f" WHERE cluster_id IN ({allowed})"
        )
        conn.execute(f"CREATE TEMP VIEW {table} AS SELECT * FROM temp.{guard}")
        guards[table] = guard
    return guards


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
    conn = connect_readonly(db_path)
    try:
        guards = None
        if principal.clusters is not None:
            guards = scope_to_clusters(conn, principal.clusters)
        result = run_bounded(
            conn,
            query,
            read_only_authorizer(TENANT_TABLES, guards=guards),
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
