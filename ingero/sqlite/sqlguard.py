"""Read-only, bounded SQL on a connection: shared by Echo's SQL endpoint and ``ingero query``.

The caller opens the connection ``mode=ro`` (SQLite itself refuses writes); this module adds
the other walls: ``query_only``, an authorizer allowing only SELECT, reads of the named tables
and ordinary functions (refusing writes, DDL, ATTACH/DETACH, every PRAGMA and
``load_extension``), a progress handler that stops a query past its time limit, a fetch loop
that stops it past its row limit or its answer's byte limit, and ``SQLITE_LIMIT_LENGTH`` and
``SQLITE_LIMIT_COLUMN`` capping what one value and one row can hold.

The authorizer is not a complete fence around tables: SQLite does not consult it for the
columns it adds for USING and NATURAL joins. Data a query must not see is kept out of the
connection's reach (as Echo does for scoped tokens), not merely refused.
"""

from __future__ import annotations

import base64
import json
import math
import sqlite3
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

MAX_QUERY_CHARS = 20_000
MAX_VALUE_BYTES = 1_000_000
# SQLite builds a whole result row before handing it over, so one row can hold this many
# values of up to the value limit each: the part of a request's memory no byte count sees.
MAX_COLUMNS = 100
# Why an answer was cut short: its row limit, its byte limit, or its time limit.
TRUNCATED_REASONS = ("rows", "bytes", "time")
_DENIED_FUNCTIONS = frozenset({"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"})
_SCHEMA_TABLES = frozenset({"sqlite_master", "sqlite_schema"})

Authorizer = Callable[[int, str | None, str | None, str | None, str | None], int]
T = TypeVar("T")


class SqlError(ValueError):
    """A query refused or stopped; the message says why (safe to show the caller)."""


@dataclass(frozen=True)
class SqlResult:
    columns: list[str]
    rows: list[Any]
    truncated_reason: str | None  # one of TRUNCATED_REASONS, None when every row is there

    @property
    def truncated(self) -> bool:
        return self.truncated_reason is not None


def json_size(value: Any) -> int:
    """Bytes of ``value`` written as compact UTF-8 JSON, as the API writes its answers."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


class ByteBudget:
    """An answer's size as JSON, counted piece by piece while it is built; None: no limit.

    Pieces are counted before they are kept, so an answer never holds more than its limit
    (plus the one piece being looked at); once a piece does not fit, none does after it,
    so what is kept is always a prefix.
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.used = 0
        self.exceeded = False

    def fits(self, piece: Any) -> bool:
        if self.limit is None:
            return True
        if self.exceeded:
            return False
        size = json_size(piece) + 1  # and the comma before it
        if self.used + size > self.limit:
            self.exceeded = True
            return False
        self.used += size
        return True

    def take(self, pieces: Iterable[T]) -> list[T]:
        """The pieces that fit, reading ``pieces`` no further than the first that does not."""
        kept: list[T] = []
        for piece in pieces:
            if not self.fits(piece):
                break
            kept.append(piece)
        return kept


def read_only_authorizer(tables: Collection[str], *, scoped_store: str | None = None) -> Authorizer:
    """Allow SELECT, reads of ``tables`` and of the schema table, and ordinary functions.

    ``scoped_store`` is for a tenant's connection (Echo's ``connect_scoped``): its main
    database is empty, the store is attached under that name (drawn at random after the
    query text was fixed) and TEMP views named after ``tables`` hold only the tenant's
    rows. A read of the store is then allowed only from inside the view of the table's
    name, and the TEMP schema table (which names the store) is refused. This is the second
    wall, not the first: the authorizer is told the innermost view *or CTE* a read comes
    from (a name the query chooses), and SQLite does not ask it at all about the columns
    it adds itself for USING and NATURAL joins. The first wall is that a query cannot
    name the store.
    """
    allowed = frozenset(t.lower() for t in tables)
    store = (scoped_store or "").lower()

    def may_read(table: str, db: str, source: str) -> bool:
        if not store:
            return db == "temp" or table in _SCHEMA_TABLES or table in allowed
        # db "" is a table named without a schema and read for no column (count(*)):
        # an unqualified name finds TEMP first, where the views are, then the empty main.
        if db in ("temp", "") and table in allowed:
            return True
        if db in ("main", "") and table in _SCHEMA_TABLES:
            return True
        return db == store and table in allowed and source == table

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
            table, schema, inside = ((s or "").lower() for s in (arg1, db, source))
            return sqlite3.SQLITE_OK if may_read(table, schema, inside) else sqlite3.SQLITE_DENY
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
    max_bytes: int | None = None,
) -> SqlResult:
    """Run one statement under the walls above; ``refused_hint`` prefixes authorizer refusals.

    With ``max_bytes`` the rows come back as JSON values (``json_value``) and the answer
    stops before the row that would take it past ``max_bytes`` of JSON. Rows are fetched
    and converted one at a time, inside the time limit: when it passes after some rows,
    those rows are the answer (``truncated_reason`` "time"); before any, it is an error.
    (Python's sqlite3 steps to the next row before returning one, so the row it was
    returning when SQLite is stopped is lost with the step.)
    """
    check_query_text(query)
    conn.execute("PRAGMA query_only = 1")
    value_limit = MAX_VALUE_BYTES if max_bytes is None else min(MAX_VALUE_BYTES, max_bytes)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, value_limit)
    conn.setlimit(sqlite3.SQLITE_LIMIT_COLUMN, MAX_COLUMNS)
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    conn.set_authorizer(authorizer)
    deadline = time.monotonic() + timeout
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
    budget = ByteBudget(max_bytes)
    columns: list[str] = []
    rows: list[Any] = []
    reason: str | None = None
    try:
        cursor = conn.execute(query, params)
        columns = [d[0] for d in cursor.description or ()]
        budget.fits(columns)
        while (row := cursor.fetchone()) is not None:
            if time.monotonic() > deadline:
                raise sqlite3.OperationalError("interrupted")
            if len(rows) == max_rows:
                reason = "rows"
                break
            kept = row if max_bytes is None else [json_value(v) for v in row]
            if not budget.fits(kept):
                reason = "bytes"
                break
            rows.append(kept)
    except sqlite3.DatabaseError as exc:
        message = str(exc)
        if message == "interrupted":
            if rows:
                return SqlResult(columns=columns, rows=rows, truncated_reason="time")
            message = f"the query ran longer than {timeout:g}s and was stopped"
        elif "not authorized" in message or "prohibited" in message:
            message = f"refused: {refused_hint} ({message})"
        raise SqlError(message) from None
    except (sqlite3.Warning, sqlite3.ProgrammingError) as exc:
        raise SqlError(str(exc)) from None
    finally:
        conn.set_progress_handler(None, 0)
        conn.set_authorizer(None)
    return SqlResult(columns=columns, rows=rows, truncated_reason=reason)


def json_value(value: Any) -> Any:
    """A value JSON can carry: bytes as base64, NaN and infinities as null."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, float) and not math.isfinite(value):  # no JSON form
        return None
    return value
