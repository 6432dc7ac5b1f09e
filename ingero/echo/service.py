"""The one entry point both front doors (HTTP API and MCP) call to answer a question."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Mapping
from typing import Any

from ingero.echo.answers import QUESTIONS
from ingero.echo.auth import Principal
from ingero.echo.config import LimitsConfig
from ingero.echo.questions import BadRequest, Context, Param
from ingero.echo.rates import GpuRates
from ingero.echo.sql import SQL_OUTPUT_SCHEMA, run_sql
from ingero.echo.store import connect_readonly
from ingero.runtime.clock import Clock, SystemClock
from ingero.sqlite.sqlguard import ByteBudget

SQL_QUESTION = "sql"
SQL_PARAM = Param(
    "query", "string", "One read-only SQLite SELECT statement", required=True, max_length=20_000
)
SQL_SUMMARY = (
    "Read-only SQL (SQLite dialect) over tables events, episodes, scores, nodes and"
    " collective_episodes;"
    " bounded in rows, bytes and time, limited to the clusters of the caller's token"
)


class Service:
    """Answers questions for a principal over fresh read-only connections (thread-safe)."""

    def __init__(
        self,
        db_path: str | os.PathLike[str],
        rates: GpuRates,
        *,
        clock: Clock | None = None,
        max_rows: int = 1000,
        sql_max_rows: int = 10_000,
        sql_timeout: float = 5.0,
        max_answer_bytes: int = LimitsConfig.max_answer_bytes,
        status: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.db_path = db_path
        self.rates = rates
        self.clock = clock or SystemClock()
        self.max_rows = max_rows
        self.sql_max_rows = sql_max_rows
        self.sql_timeout = sql_timeout
        self.max_answer_bytes = max_answer_bytes
        self._status = status

    def names(self) -> list[str]:
        return [*QUESTIONS, SQL_QUESTION]

    def answer(self, name: str, raw: Mapping[str, Any], principal: Principal) -> dict[str, Any]:
        """Validate ``raw`` for question ``name`` and answer it; BadRequest on bad input."""
        if name == SQL_QUESTION:
            unknown = sorted(set(raw) - {"query"})
            if unknown:
                raise BadRequest(f"unknown parameter {unknown[0]!r} (known: query)")
            if raw.get("query") is None:
                raise BadRequest("parameter query is required")
            return run_sql(
                self.db_path,
                SQL_PARAM.parse(raw["query"]),
                principal,
                max_rows=self.sql_max_rows,
                timeout=self.sql_timeout,
                max_bytes=self.max_answer_bytes,
            )
        question = QUESTIONS.get(name)
        if question is None:
            raise BadRequest(f"unknown question {name!r} (known: {', '.join(self.names())})")
        args = question.parse(raw)
        budget = ByteBudget(self.max_answer_bytes)
        ctx = Context(principal, self.clock.now(), self.rates, self.max_rows, budget)
        conn = connect_readonly(self.db_path)
        # The SQL endpoint's time limit holds for questions too: a question over a wide window
        # of a large store must not hold a worker thread (and its answer's memory) for long.
        deadline = time.monotonic() + self.sql_timeout
        conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
        try:
            answer = question.run(conn, ctx, args)
        except sqlite3.OperationalError as exc:
            if str(exc) != "interrupted":
                raise
            raise BadRequest(
                f"the question ran longer than {self.sql_timeout:g}s and was stopped;"
                " narrow it (since/until, cluster_id, limit)"
            ) from None
        finally:
            conn.close()
        answer["truncated"] = budget.exceeded
        answer["truncated_reason"] = "bytes" if budget.exceeded else None
        return answer

    def status(self) -> dict[str, Any]:
        return self._status() if self._status else {}

    @staticmethod
    def sql_output_schema() -> dict[str, Any]:
        return SQL_OUTPUT_SCHEMA
