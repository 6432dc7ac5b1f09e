"""Line-table decoders against CPython's own answers, and fuzzed."""

from __future__ import annotations

import gc
import json
import shutil
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingero.trace.pyframes.linetable import line_for, ranges_310, ranges_311
from tests.python314 import fetch as python314


def _codes() -> Iterator[types.CodeType]:
    """Every code object reachable from the functions alive in this interpreter."""
    seen: set[int] = set()
    stack = [o.__code__ for o in gc.get_objects() if isinstance(o, types.FunctionType)]
    while stack:
        code = stack.pop()
        if id(code) in seen:
            continue
        seen.add(id(code))
        yield code
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))


def _by_offset(code: types.CodeType) -> dict[int, int | None]:
    out: dict[int, int | None] = {}
    for start, end, line in code.co_lines():
        for off in range(start, end, 2):
            out[off] = line
    return out


def test_311_table_matches_co_lines_and_co_positions_on_real_code() -> None:
    checked = 0
    for code in _codes():
        want = _by_offset(code)
        positions = list(code.co_positions())
        got = dict.fromkeys(range(0, len(code.co_code), 2))
        for start, end, line in ranges_311(code.co_linetable, code.co_firstlineno):
            for off in range(start, end, 2):
                got[off] = line
        assert got == {off: want.get(off) for off in got}, code
        assert [got[i * 2] for i in range(len(positions))] == [p[0] for p in positions], code
        checked += 1
    assert checked > 2000  # the test's reach: thousands of real functions
    code = _executing.__code__
    for start, end, line in code.co_lines():
        assert line_for(code.co_linetable, code.co_firstlineno, start, "311") == line
        assert line_for(code.co_linetable, code.co_firstlineno, end - 2, "311") == line


def _executing() -> tuple[int, int, int]:
    """(line being executed, line from our decoder, def line) of this very frame."""
    frame = sys._getframe()
    code = frame.f_code
    lasti, executing = frame.f_lasti, frame.f_lineno  # both read on this one line
    decoded = line_for(code.co_linetable, code.co_firstlineno, lasti, "311")
    return executing, decoded or -1, code.co_firstlineno


def test_the_executing_line_is_not_the_def_line() -> None:
    executing, decoded, first = _executing()
    assert decoded == executing
    assert decoded != first


# Every code object a real interpreter has (3.10, 3.14) with its own answers: the table,
# co_firstlineno, the bytecode's size, co_lines() and (3.11+) co_positions()' lines.
DUMP = """
import gc, json, types
seen, out = set(), []
stack = [o.__code__ for o in gc.get_objects() if isinstance(o, types.FunctionType)]
while stack:
    c = stack.pop()
    if id(c) in seen: continue
    seen.add(id(c))
    pos = [p[0] for p in c.co_positions()] if hasattr(c, "co_positions") else []
    out.append([c.co_linetable.hex(), c.co_firstlineno, len(c.co_code), list(c.co_lines()), pos])
    stack.extend(x for x in c.co_consts if isinstance(x, types.CodeType))
print(json.dumps(out))
"""


# 3.10 wrote its own format; when a 3.10 interpreter is here, compare with its co_lines().


def _python310() -> str | None:
    found = [
        *sorted(Path.home().glob(".pyenv/versions/3.10*/bin/python3.10")),
        shutil.which("python3.10"),
    ]
    for cand in found:
        if (
            cand
            and subprocess.run([str(cand), "-c", ""], capture_output=True, check=False).returncode
            == 0
        ):
            return str(cand)
    return None


def test_310_table_matches_a_real_310_co_lines() -> None:
    py = _python310()
    if py is None:
        pytest.skip("no python3.10 here to compare the 3.10 decoder with")
    out = subprocess.run([py, "-c", DUMP], capture_output=True, text=True, check=True, timeout=120)
    entries = json.loads(out.stdout)
    assert len(entries) > 500
    for table_hex, first, _, lines, _ in entries:
        got = list(ranges_310(bytes.fromhex(table_hex), first))
        assert [list(r) for r in got] == lines
    for table_hex, first, _, lines, _ in entries[:300]:
        for start, end, line in lines:
            assert line_for(bytes.fromhex(table_hex), first, start, "310") == line
            assert line_for(bytes.fromhex(table_hex), first, end - 2, "310") == line


# 3.12-3.14 keep 3.11's location-table format: checked on a real 3.14 (tests/python314).


def test_311_decoder_matches_a_real_314_co_lines_and_co_positions() -> None:
    py = python314.ensure()
    if not isinstance(py, Path):
        pytest.skip(py)
    out = subprocess.run(
        [str(py), "-c", DUMP], capture_output=True, text=True, check=True, timeout=120
    )
    entries = json.loads(out.stdout)
    assert len(entries) > 500
    for table_hex, first, size, lines, positions in entries:
        got: dict[int, int | None] = dict.fromkeys(range(0, size, 2))
        for start, end, line in ranges_311(bytes.fromhex(table_hex), first):
            for off in range(start, end, 2):
                got[off] = line
        want = {off: line for start, end, line in lines for off in range(start, end, 2)}
        assert got == {off: want.get(off) for off in got}
        assert [got[i * 2] for i in range(len(positions))] == positions


# A 3.11 location-table encoder (Objects/locations.md), to round-trip random line sequences.
def _varint(v: int) -> bytes:
    out = bytearray()
    while v >= 64:
        out.append(64 | (v & 63))
        v >>= 6
    out.append(v)
    return bytes(out)


def _svarint(v: int) -> bytes:
    return _varint(((-v) << 1) | 1 if v < 0 else v << 1)


entry = st.tuples(
    st.sampled_from(["none", "long", "nocol", "one", "short"]),
    st.integers(1, 8),  # code units
    st.integers(-50, 50),  # line delta
)


@settings(max_examples=300, deadline=None)
@given(st.lists(entry, max_size=40), st.integers(1, 10_000))
def test_311_decoder_round_trips_encoded_tables(
    entries: list[tuple[str, int, int]], first: int
) -> None:
    table, want, line = bytearray(), [], first
    for kind, units, delta in entries:
        if kind == "one":
            delta = abs(delta) % 3
        if kind == "short":
            delta = 0
        code = {"none": 15, "long": 14, "nocol": 13, "short": 0}.get(kind, 10 + delta)
        table.append(0x80 | (code << 3) | (units - 1))
        if kind == "long":
            table += _svarint(delta) + _varint(0) + _varint(5) + _varint(9)
        elif kind == "nocol":
            table += _svarint(delta)
        elif kind == "one":
            table += bytes([3, 7])
        elif kind == "short":
            table += bytes([0x12])
        if kind != "none":
            line += delta
        want.extend([None if kind == "none" else line] * units)
    got = [line_for(bytes(table), first, i * 2, "311") for i in range(len(want))]
    assert got == want
    assert line_for(bytes(table), first, len(want) * 2, "311") is None


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200), st.integers(-5, 100_000), st.integers(-4, 600))
def test_decoders_never_fail_on_garbage(table: bytes, first: int, offset: int) -> None:
    for fmt, ranges in (("310", ranges_310), ("311", ranges_311)):
        prev_end = 0
        for start, end, _line in ranges(table, first):
            assert start >= prev_end and end > start  # ordered, never overlapping
            prev_end = end
        got = line_for(table, first, offset, fmt)
        assert got is None or isinstance(got, int)
