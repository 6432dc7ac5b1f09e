"""The question framework: what a question Echo answers is, once for every surface.

A :class:`Question` is its parameters (each a :class:`Param`, validated here, so the HTTP
API and MCP refuse the same bad input with the same message), a JSON Schema of its answer
(for the OpenAPI document and the MCP tool descriptions) and a function over a read-only
SQLite connection, given a :class:`Context` (the caller's principal, the clock, the GPU
rates, the answer's limits). A :class:`Registry` collects the questions, each registered
beside its function; the questions themselves are ``ingero.echo.answers``.
"""

from __future__ import annotations

import math
import re
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ingero.echo.auth import Principal
from ingero.echo.rates import GpuRates
from ingero.sqlite.sqlguard import TRUNCATED_REASONS, ByteBudget

T = TypeVar("T")


class BadRequest(ValueError):
    """A question's parameters are missing, unknown or of the wrong type."""


@dataclass(frozen=True)
class Param:
    name: str
    type: str  # JSON Schema type: string | number | integer
    description: str
    required: bool = False
    default: Any = None
    enum: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    max_length: int = 256  # ids and names; the SQL text allows more
    pattern: str | None = None

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "description": self.description}
        if self.type == "string":
            out.update(minLength=1, maxLength=self.max_length)
            if self.pattern:
                out["pattern"] = self.pattern
        if self.default is not None:
            out["default"] = self.default
        if self.enum:
            out["enum"] = list(self.enum)
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        return out

    def parse(self, value: Any) -> Any:
        """Coerce a query-string or JSON value; raises BadRequest naming the parameter."""
        if self.type == "string":
            if not isinstance(value, str) or not value:
                raise BadRequest(f"parameter {self.name} must be a non-empty string")
            if len(value) > self.max_length:
                raise BadRequest(
                    f"parameter {self.name} is longer than {self.max_length} characters"
                )
            if self.enum and value not in self.enum:
                raise BadRequest(f"parameter {self.name} must be one of {', '.join(self.enum)}")
            if self.pattern and not re.search(self.pattern, value):
                raise BadRequest(f"parameter {self.name} must look like 24h, 30m or 7d")
            return value
        number: float | int
        try:
            if isinstance(value, bool):
                raise ValueError
            if self.type == "integer":
                number = int(value) if isinstance(value, int | str) else _int_float(value)
            else:
                number = float(value)
        except (TypeError, ValueError):
            raise BadRequest(
                f"parameter {self.name} must be a{'n integer' if self.type == 'integer' else ' number'}"
            ) from None
        if isinstance(number, float) and not math.isfinite(number):
            raise BadRequest(f"parameter {self.name} must be finite")
        if self.minimum is not None and number < self.minimum:
            raise BadRequest(f"parameter {self.name} must be at least {self.minimum:g}")
        if self.maximum is not None and number > self.maximum:
            raise BadRequest(f"parameter {self.name} must be at most {self.maximum:g}")
        return number


def _int_float(value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise ValueError


@dataclass
class Context:
    """What a question needs besides its parameters."""

    principal: Principal
    now: float
    rates: GpuRates
    max_rows: int = 1000
    # Counts the answer's lists as JSON while they are built (unlimited by default).
    budget: ByteBudget = field(default_factory=lambda: ByteBudget(None))

    def fit(self, items: Iterable[T]) -> list[T]:
        """The items of one of the answer's lists that fit its byte limit, read lazily (an
        event's ``extra`` can be large: rows past the limit are never fetched)."""
        return self.budget.take(items)


Answer = Callable[[sqlite3.Connection, Context, dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Question:
    name: str
    summary: str
    params: tuple[Param, ...]
    output: dict[str, Any]
    run: Answer

    def parse(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        known = {p.name: p for p in self.params}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise BadRequest(
                f"unknown parameter {unknown[0]!r} (known: {', '.join(known) or 'none'})"
            )
        args: dict[str, Any] = {}
        for p in self.params:
            value = raw.get(p.name)
            if value is None:
                if p.required:
                    raise BadRequest(f"parameter {p.name} is required")
                args[p.name] = p.default
            else:
                args[p.name] = p.parse(value)
        since, until = args.get("since"), args.get("until")
        if since is not None and until is not None and since > until:
            raise BadRequest("since must not be after until")
        if since is not None and args.get("last") is not None:
            raise BadRequest("give since or last, not both")
        return args

    def input_schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {p.name: p.schema() for p in self.params},
            "required": [p.name for p in self.params if p.required],
            "additionalProperties": False,
        }


class Registry:
    """The questions, each registered by :meth:`question` where its function is defined (its
    parameters and answer schema beside its code), listed by :meth:`ordered`."""

    def __init__(self) -> None:
        self._questions: dict[str, Question] = {}

    def question(
        self, name: str, summary: str, params: tuple[Param, ...], output: dict[str, Any]
    ) -> Callable[[Answer], Answer]:
        """A decorator registering the function below it as the question ``name``."""

        def register(run: Answer) -> Answer:
            if name in self._questions:
                raise ValueError(f"question {name!r} is registered twice")
            self._questions[name] = Question(name, summary, params, output, run)
            return run

        return register

    def ordered(self, names: Sequence[str]) -> dict[str, Question]:
        """The registered questions in the order ``names`` gives (the order every surface
        lists them in), which must name each exactly once."""
        if sorted(names) != sorted(self._questions):
            missing = sorted(set(self._questions) - set(names))
            unknown = sorted(set(names) - set(self._questions))
            raise ValueError(f"question order: missing {missing}, unknown or twice {unknown}")
        return {name: self._questions[name] for name in names}


# -- the JSON Schema vocabulary of answers ----------------------------------------------------

NUM = {"type": "number"}
NUM_N = {"type": ["number", "null"]}
STR = {"type": "string"}
STR_N = {"type": ["string", "null"]}
INT = {"type": "integer"}
INT_N = {"type": ["integer", "null"]}


# The two fields every answer (SQL and questions) ends with.
TRUNCATION_SCHEMA: dict[str, Any] = {
    "truncated": {"type": "boolean"},
    "truncated_reason": {
        "type": ["string", "null"],
        "enum": [*TRUNCATED_REASONS, None],
        "description": "Why the answer was cut short: rows (the row limit), bytes (the"
        " answer's byte limit) or time (the time limit); null when it is whole",
    },
}


def obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
    }


def answer_schema(props: dict[str, Any]) -> dict[str, Any]:
    """An answer's schema: its fields, then the two every answer ends with."""
    return obj({**props, **TRUNCATION_SCHEMA})


def list_of(item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": item}
