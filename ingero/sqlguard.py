"""Read-only, bounded SQL on a connection: shared by Echo's SQL endpoint and ``ingero query``.

The caller opens the connection ``mode=ro`` (SQLite itself refuses writes); this module adds
the other walls: ``query_only``, an authorizer allowing only SELECT, reads of the named tables
and ordinary functions (refusing writes, DDL, ATTACH/DETACH, every PRAGMA and
``load_extension``), a progress handler that stops a query past its time limit, ``fetchmany``
that stops it past its row limit, and ``SQLITE_LIMIT_LENGTH`` capping value sizes.
"""

from __future__ import annotations

import base64
import math
import sqlite3
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

MAX_QUERY_CHARS = 20_000
MAX_VALUE_BYTES = 1_000_000
_DENIED_FUNCTIONS = frozenset({"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"})
_SCHEMA_TABLES = frozenset({"sqlite_master", "sqlite_schema"})

Authorizer = Callable[[int, str | None, str | None, str | None, str | None], int]


class SqlError(ValueError):
    """A query refused or stopped; the message says why (safe to show the caller)."""


@dataclass(frozen=True)
class SqlResult:
    columns: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool


def read_only_authorizer(tables: Collection[str], *, through_views: bool = False) -> Authorizer:
    """Allow SELECT and reads of ``tables`` (and the schema table); deny everything else.

    With ``through_views`` a read of a real table is allowed only through the TEMP view of the
    same name that shadows it (the caller creates those views before installing this).
    """
    allowed = frozenset(t.lower() for t in tables)

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
            if table not in allowed:
                return sqlite3.SQLITE_DENY
            if through_views and (source or "").lower() not in allowed:
                return sqlite3.SQLITE_DENY
            return sqlite3.SQLITE_OK
        return sqlite3.SQLITE_DENY

    return check


def check_query_text(query: object) -> str:
    """The query as a string, or SqlError when it is empty or too long."""
    if not isinstance(query, str) or not query.strip():
        raise SqlError("the query is empty")
    if len(query) > MAX_QUERY_CHARS:
        raise SqlError(f"the query is longer than {MAX_QUERY_CHARS} characters")
    return query


def run_bounded(
    conn: sqlite3.Connection,
    query: str,
    authorizer: Authorizer,
    *,
    max_rows: int,
    timeout: float,
    refused_hint: str,
    params: tuple[Any, ...] = (),
) -> SqlResult:
    """Run one statement under the walls above; ``refused_hint`` prefixes authorizer refusals."""
    check_query_text(query)
    conn.execute("PRAGMA query_only = 1")
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    conn.set_authorizer(authorizer)
    deadline = time.monotonic() + timeout
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
    try:
        cursor = conn.execute(query, params)
        rows = cursor.fetchmany(max_rows + 1)
    except sqlite3.DatabaseError as exc:
        message = str(exc)
        if message == "interrupted":
            message = f"the query ran longer than {timeout:g}s and was stopped"
        elif "not authorized" in message or "prohibited" in message:
            message = f"refused: {refused_hint} ({message})"
        raise SqlError(message) from None
    except (sqlite3.Warning, sqlite3.ProgrammingError) as exc:
        raise SqlError(str(exc)) from None
    finally:
        conn.set_progress_handler(None, 0)
        conn.set_authorizer(None)
    columns = [d[0] for d in cursor.description or ()]
    return SqlResult(columns=columns, rows=rows[:max_rows], truncated=len(rows) > max_rows)


def json_value(value: Any) -> Any:
    """A value JSON can carry: bytes as base64, NaN and infinities as null."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, float) and not math.isfinite(value):  # no JSON form
        return None
    return value
