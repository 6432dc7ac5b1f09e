"""The annotate codec fuzzed with any JSON value in any field (huge numbers, lone surrogates,
every type): each line is a mark the node DB stores, or one refusal the client can read."""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils
from hypothesis import given, settings
from hypothesis import strategies as st

from ingero.annotate.codec import (
    KINDS,
    MAX_INT,
    MIN_INT,
    REASONS,
    LineError,
    decode_line,
    decode_refusal,
    encode_mark,
    encode_refusal,
)
from ingero.annotate.server import Annotations, ServerLimits, Writer
from ingero.nodedb.schema import connect
from ingero.nodedb.writer import Batch, write_batch
from ingero.runtime.clock import ManualClock

# Text as JSON can spell it: any code point, lone surrogates (\ud800) often.
chars = st.one_of(
    st.characters(exclude_categories=()),
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
)
text = st.text(chars, max_size=12)
numbers = st.one_of(
    st.integers(),
    st.integers(min_value=10**300, max_value=10**400),
    st.integers(min_value=-(10**400), max_value=-(10**300)),
    st.sampled_from([MAX_INT, MAX_INT + 1, MIN_INT, MIN_INT - 1, 2**64]),
    st.floats(),  # nan and ±inf too (written as NaN/Infinity: not JSON)
)
leaf = st.one_of(st.none(), st.booleans(), numbers, text)
json_values = st.recursive(
    leaf,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(text, children, max_size=3),
    max_leaves=8,
)


@st.composite
def mark_objects(draw: st.DrawFn) -> dict[str, Any]:
    """An object with any of a mark's fields, each mostly of its own shape (so the checks
    past the first run) and sometimes any JSON value at all."""

    def often(good: st.SearchStrategy[Any]) -> Any:
        return draw(good if draw(st.integers(0, 9)) < 8 else json_values)

    kind = often(st.sampled_from(KINDS))
    body: dict[str, Any] = {"kind": kind}
    if kind != "step" or draw(st.booleans()):
        body["name"] = often(st.text(chars, min_size=1, max_size=12))
    if kind == "phase" or draw(st.integers(0, 9)) == 0:
        body["state"] = often(st.sampled_from(["begin", "end"]))
    if draw(st.booleans()):
        body["step"] = often(st.integers(0, MAX_INT) | numbers)
    if draw(st.booleans()):
        body["labels"] = often(st.dictionaries(text, json_values, max_size=4))
    if draw(st.booleans()):
        body["ts"] = often(st.floats(1.7e9, 1.8e9) | numbers)
    if draw(st.integers(0, 9)) == 0:
        body[draw(text)] = draw(json_values)  # an unknown field, or a known one again
    return body


def strings_of(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from strings_of(k)
            yield from strings_of(v)


@pytest.fixture(scope="module")
def node_db() -> Iterator[sqlite_utils.Database]:
    """A real node DB the accepted lines' rows must go into."""
    with tempfile.TemporaryDirectory() as tmp:
        db = connect(Path(tmp) / "node.db")
        yield db
        db.conn.close()


@settings(deadline=None, max_examples=400)
@given(mark_objects(), st.booleans())
def test_any_json_value_in_any_field_is_a_mark_the_node_db_stores_or_one_refusal(
    node_db: sqlite_utils.Database, body: dict[str, Any], ascii_only: bool
) -> None:
    text = json.dumps(body, ensure_ascii=ascii_only)  # \ud800 escapes, or the raw code point
    line = text.encode("utf-8", "surrogatepass")
    c = Annotations(ManualClock(), ServerLimits(burst=10, lines_per_s=1.0))
    c.open(1, Writer(7, 1000, "42", 0))
    c.feed(1, line + b"\n")
    replies = c.replies(1).splitlines()
    try:
        mark = decode_line(line)
    except LineError as exc:
        assert exc.reason in REASONS and "\n" not in str(exc)
        assert [decode_refusal(r) for r in replies] == [(exc.reason, exc.detail)]
        assert decode_refusal(encode_refusal(exc.reason, exc.detail)) == (exc.reason, exc.detail)
        return
    for s in [mark.kind, mark.name, *strings_of(mark.labels)]:
        s.encode("utf-8")  # never a lone surrogate
    if mark.ts is not None:
        assert math.isfinite(mark.ts)
    for number in [mark.step, *[v for v in mark.labels.values() if isinstance(v, int)]]:
        assert number is None or MIN_INT <= number <= MAX_INT
    assert decode_line(encode_mark(mark)) == mark
    take = c.take()
    if replies:  # only the clock or a phase refuses a decoded mark
        assert [decode_refusal(r)[0] for r in replies] in (["clock"], ["phase"])
        return
    assert len(take.marks) == (0 if mark.kind == "phase" and mark.state == "end" else 1)
    write_batch(node_db, Batch(intervals=take.steps, marks=take.marks))


@settings(deadline=None)
@given(st.text(chars, max_size=40), st.text(chars, max_size=80))
def test_a_refusal_of_any_text_round_trips(reason: str, detail: str) -> None:
    line = encode_refusal(reason, detail)
    assert line.count(b"\n") == 1
    assert decode_refusal(line) == (reason, detail)
