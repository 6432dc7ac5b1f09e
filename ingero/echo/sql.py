"""Read-only, bounded SQL over the event store.

Four walls: the connection is opened ``mode=ro`` (SQLite itself refuses writes) and set
``query_only``; an authorizer allows only SELECT, reads and ordinary functions, refusing
writes, DDL, ATTACH/DETACH, every PRAGMA and ``load_extension``; a progress handler stops a
query past its time limit and ``fetchmany`` stops it past its row limit; value sizes are
capped with ``SQLITE_LIMIT_LENGTH``. For a token scoped to clusters, each table is shadowed by
a TEMP view of the same name holding only the allowed clusters, and the authorizer refuses
any read of the real table that does not come through that view (``main.events`` included).
"""

from __future__ import annotations

import os
from typing import Any

from ingero.echo.auth import Principal
from ingero.echo.schema import TENANT_TABLES
from ingero.echo.store import connect_readonly
from ingero.sqlguard import (
    SqlError,
    check_query_text,
    json_value,
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
        "truncated": {"type": "boolean"},
        "tables": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["columns", "rows", "row_count", "truncated", "tables"],
}


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def run_sql(
    db_path: str | os.PathLike[str],
    query: str,
    principal: Principal,
    *,
    max_rows: int = 10_000,
    timeout: float = 5.0,
) -> dict[str, Any]:
    """Run one read-only statement; returns columns, rows and whether rows were cut off."""
    check_query_text(query)
    conn = connect_readonly(db_path)
    try:
        conn.execute("PRAGMA query_only = 0")  # the TEMP views only; main stays mode=ro
        scoped = principal.clusters is not None
        if principal.clusters is not None:
            allowed = ",".join(_quote(c) for c in sorted(principal.clusters)) or "NULL"
            for table in TENANT_TABLES:
                conn.execute(
                    f"CREATE TEMP VIEW {table} AS SELECT * FROM main.{table}"
                    f" WHERE cluster_id IN ({allowed})"
                )
        result = run_bounded(
            conn,
            query,
            read_only_authorizer(TENANT_TABLES, through_views=scoped),
            max_rows=max_rows,
            timeout=timeout,
            refused_hint="Echo's SQL is read-only and limited to its tables",
        )
    finally:
        conn.close()
    return {
        "columns": result.columns,
        "rows": [[json_value(v) for v in row] for row in result.rows],
        "row_count": len(result.rows),
        "truncated": result.truncated,
        "tables": list(TENANT_TABLES),
    }
