"""The annotate socket's NDJSON line codec: a job's mark lines and the server's refusals.

Pure standard library, so a training job imports the client without ingero's heavy
dependencies. Each encoder's decoder sits beside it and returns everything it wrote; the
decoder is the server's bound on what one line may hold (``Limits``).

A mark line is one JSON object and a newline::

    {"kind": "step", "step": 1200}
    {"kind": "phase", "name": "checkpoint", "state": "begin"}
    {"kind": "label", "name": "dataset", "labels": {"shard": "7"}}

``labels`` (an object of short keys to strings, numbers or booleans) may ride on any kind;
``ts`` (Unix seconds, the job's clock) is optional and checked against the server's clock.
A refusal is ``{"error": REASON, "detail": TEXT}``: one line per refused line or connection.

The decoder returns only what the node DB can store: every string valid Unicode (a lone
surrogate, which JSON's ``\\ud800`` can spell, is refused), every number finite and within
64 bits, so no accepted line can fail a write later.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Final

# Where the server listens and the client connects unless told otherwise (the client also
# reads INGERO_ANNOTATE_SOCKET, so a job is pointed at a server without code changes).
DEFAULT_SOCKET: Final = "/run/ingero/annotate.sock"
SOCKET_ENV: Final = "INGERO_ANNOTATE_SOCKET"
KINDS: Final = ("step", "phase", "label")
STATES: Final = ("begin", "end")
# Why a line or a connection was refused (the ``error`` of a refusal, and a counter each).
REASONS: Final = (
    "too_long",  # the line is longer than max_line_bytes
    "bad_json",  # not one JSON object
    "bad_line",  # a JSON object that is not a mark (kind, name, step, state, ts)
    "too_many_labels",
    "too_big",  # a name, label key or label value over its size
    "clock",  # the job's ts too far from the server's clock
    "phase",  # an end without its begin, a begin already open, too many open
    "rate",  # over the writer's lines per second
    "clients",  # over the server's client count
    "idle",  # a connection silent, or inside one line, for too long (then closed)
    "internal",  # the server failed on a line it should have taken (a bug; it serves on)
)


@dataclass(frozen=True)
class Limits:
    """What one line and one writer may hold; the server's defaults are these."""

    max_line_bytes: int = 4096
    max_labels: int = 16
    max_key_bytes: int = 64
    max_value_bytes: int = 256
    max_name_bytes: int = 64
    # The job's own ts is taken within this many seconds of the server's clock.
    max_clock_skew_s: float = 60.0


DEFAULT_LIMITS: Final = Limits()

LabelValue = str | int | float | bool


@dataclass(frozen=True)
class Mark:
    kind: str  # step | phase | label
    name: str  # "step" for a step
    step: int | None = None
    state: str | None = None  # begin | end, for a phase
    labels: dict[str, LabelValue] = field(default_factory=dict)
    ts: float | None = None  # the job's clock, where it sent one


class LineError(ValueError):
    """A line the server refuses; ``reason`` is one of REASONS."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def encode_mark(mark: Mark) -> bytes:
    """One NDJSON line (newline included) for ``mark``."""
    body: dict[str, object] = {"kind": mark.kind}
    if mark.kind != "step" or mark.name != "step":
        body["name"] = mark.name
    if mark.step is not None:
        body["step"] = mark.step
    if mark.state is not None:
        body["state"] = mark.state
    if mark.labels:
        body["labels"] = mark.labels
    if mark.ts is not None:
        body["ts"] = mark.ts
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


# A label integer or a step fits SQLite's 64-bit INTEGER; a ts is a float far from overflow.
MAX_INT: Final = 2**63 - 1
MIN_INT: Final = -(2**63)


def _size(text: str, what: str) -> int:
    """UTF-8 bytes of ``text``; LineError when it holds a lone surrogate (not Unicode text,
    so SQLite could not store it)."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise LineError("bad_line", f"{what} is not valid Unicode (a lone surrogate)") from None


def _check_name(value: object, what: str, limit: int) -> str:
    if not isinstance(value, str) or not value:
        raise LineError("bad_line", f"{what} must be a non-empty string")
    if _size(value, what) > limit:
        raise LineError("too_big", f"{what} is longer than {limit} bytes")
    return value


def _labels(value: object, limits: Limits) -> dict[str, LabelValue]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise LineError("bad_line", "labels must be an object")
    if len(value) > limits.max_labels:
        raise LineError("too_many_labels", f"{len(value)} labels, at most {limits.max_labels}")
    labels: dict[str, LabelValue] = {}
    for key, item in value.items():
        _check_name(key, "a label key", limits.max_key_bytes)
        if isinstance(item, str):
            if _size(item, f"label {key!r}") > limits.max_value_bytes:
                raise LineError(
                    "too_big", f"label {key!r} is longer than {limits.max_value_bytes} bytes"
                )
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise LineError("bad_line", f"label {key!r} is not a finite number")
        elif not isinstance(item, int):  # bool is an int
            raise LineError("bad_line", f"label {key!r} must be a string, number or boolean")
        elif not MIN_INT <= item <= MAX_INT:
            raise LineError("bad_line", f"label {key!r} is beyond a 64-bit integer")
        labels[key] = item
    return labels


def _reject_constant(name: str) -> None:
    raise LineError("bad_json", f"{name} is not JSON")


def decode_line(line: bytes, limits: Limits = DEFAULT_LIMITS) -> Mark:
    """The mark on one line (its newline optional); LineError when it is not one."""
    if len(line.rstrip(b"\n")) > limits.max_line_bytes:
        raise LineError("too_long", f"line longer than {limits.max_line_bytes} bytes")
    try:
        body = json.loads(line, parse_constant=_reject_constant)
    except LineError:
        raise
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise LineError("bad_json", f"not JSON ({type(exc).__name__})") from None
    if not isinstance(body, dict):
        raise LineError("bad_json", "a line is one JSON object")
    unknown = set(body) - {"kind", "name", "step", "state", "labels", "ts"}
    if unknown:
        raise LineError("bad_line", f"unknown field {sorted(unknown)[0]!r}")
    kind = body.get("kind")
    if kind not in KINDS:
        raise LineError("bad_line", f"kind must be one of {', '.join(KINDS)}")
    step = body.get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise LineError("bad_line", "step must be a non-negative integer")
    if step is not None and step > MAX_INT:
        raise LineError("bad_line", "step is too large")
    if kind == "step":
        name = _check_name(body.get("name", "step"), "name", limits.max_name_bytes)
    else:
        name = _check_name(body.get("name"), "name", limits.max_name_bytes)
    state = body.get("state")
    if kind == "phase":
        if state not in STATES:
            raise LineError("bad_line", "a phase's state must be begin or end")
    elif state is not None:
        raise LineError("bad_line", "only a phase has a state")
    return Mark(kind, name, step, state, _labels(body.get("labels"), limits), _ts(body.get("ts")))


def _ts(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LineError("bad_line", "ts must be Unix seconds")
    try:
        # An integer of 400 digits is valid JSON: float() overflows on it (and isfinite
        # on the int itself raises OverflowError rather than answering).
        ts = float(value)
    except OverflowError:
        raise LineError("bad_line", "ts must be Unix seconds (finite)") from None
    if not math.isfinite(ts):
        raise LineError("bad_line", "ts must be Unix seconds (finite)")
    return ts


def encode_refusal(reason: str, detail: str) -> bytes:
    """The server's one-line answer to a refused line or connection."""
    text = json.dumps({"error": reason, "detail": detail}, ensure_ascii=False)
    # A lone surrogate (from a refused line's own text) is written as JSON's \udxxx escape,
    # which decodes back to it: encoding it as UTF-8 would raise instead.
    return text.encode("utf-8", "backslashreplace") + b"\n"


def decode_refusal(line: bytes) -> tuple[str, str]:
    """(reason, detail) of a refusal line; ValueError when it is not one."""
    body = json.loads(line)
    if not isinstance(body, dict) or not isinstance(body.get("error"), str):
        raise ValueError("not a refusal line")
    detail = body.get("detail", "")
    return body["error"], detail if isinstance(detail, str) else str(detail)
