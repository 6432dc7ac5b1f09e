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

import base64
import math
import os
import sqlite3
import time
from typing import Any

from ingero.echo.auth import Principal
from ingero.echo.schema import TENANT_TABLES
from ingero.echo.store import connect_readonly

_MAX_QUERY_CHARS = 20_000
_MAX_VALUE_BYTES = 1_000_000
_DENIED_FUNCTIONS = frozenset({"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"})
_SCHEMA_TABLES = frozenset({"sqlite_master", "sqlite_schema"})

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


class SqlError(ValueError):
    """A query refused or stopped; the message says why (safe to show the caller)."""


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _authorizer(scoped: bool) -> Any:
    def check(
        action: int, arg1: str | None, arg2: str | None, db: str | None, source: str | None
    ) -> int:
        if action in (sqlite3.SQLITE_SELECT, sqlite3.SQLITE_RECURSIVE):
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION:
            return (
                sqlite3.SQLITE_DENY
                if (arg2 or "").lower() in _DENIED_FUNCTIONS
                else sqlite3.SQLITE_OK
            )
        if action == sqlite3.SQLITE_READ:
            table = (arg1 or "").lower()
            if db == "temp" or table in _SCHEMA_TABLES:
                return sqlite3.SQLITE_OK
            if table not in TENANT_TABLES:
                return sqlite3.SQLITE_DENY
            if scoped and source not in TENANT_TABLES:
                return sqlite3.SQLITE_DENY  # the real table, not through the tenant's view
            return sqlite3.SQLITE_OK
        return sqlite3.SQLITE_DENY

    return check


def run_sql(
    db_path: str | os.PathLike[str],
    query: str,
    principal: Principal,
    *,
    max_rows: int = 10_000,
    timeout: float = 5.0,
) -> dict[str, Any]:
    """Run one read-only statement; returns columns, rows and whether rows were cut off."""
    if not isinstance(query, str) or not query.strip():
        raise SqlError("the query is empty")
    if len(query) > _MAX_QUERY_CHARS:
        raise SqlError(f"the query is longer than {_MAX_QUERY_CHARS} characters")
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
        conn.execute("PRAGMA query_only = 1")
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, _MAX_VALUE_BYTES)
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        conn.set_authorizer(_authorizer(scoped))
        deadline = time.monotonic() + timeout
        conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
        try:
            cursor = conn.execute(query)
            rows = cursor.fetchmany(max_rows + 1)
        except sqlite3.DatabaseError as exc:
            message = str(exc)
            if message == "interrupted":
                message = f"the query ran longer than {timeout:g}s and was stopped"
            elif "not authorized" in message or "prohibited" in message:
                message = f"refused: Echo's SQL is read-only and limited to its tables ({message})"
            raise SqlError(message) from None
        except (sqlite3.Warning, sqlite3.ProgrammingError) as exc:
            raise SqlError(str(exc)) from None
        columns = [d[0] for d in cursor.description or ()]
    finally:
        conn.close()
    truncated = len(rows) > max_rows
    rows = rows[:max_rows]
    return {
        "columns": columns,
        "rows": [[_json_value(v) for v in row] for row in rows],
        "row_count": len(rows),
        "truncated": truncated,
        "tables": list(TENANT_TABLES),
    }


def _json_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, float) and not math.isfinite(value):  # no JSON form
        return None
    return value
