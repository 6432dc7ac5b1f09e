"""The annotate client fuzzed with every value a training loop passes (NumPy scalars and
arrays, bytes, fractions, decimals, huge or non-finite numbers, lone surrogates, objects
whose conversions raise) on a real Unix socket: it never raises, and every line it writes is
one the server's codec takes."""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ingero.annotate.client import Annotator
from ingero.annotate.codec import decode_line

chars = st.one_of(
    st.characters(exclude_categories=()),
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
)


class Hostile:
    """An object whose every conversion raises."""

    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __index__(self) -> int:
        raise RuntimeError("no index")

    def __float__(self) -> float:
        raise RuntimeError("no float")


class Stringy:
    def __str__(self) -> str:
        return "x" * 5000


DTYPES = [np.int8, np.int64, np.uint64, np.float16, np.float32, np.float64, np.bool_,
          np.complex64]  # fmt: skip
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**63 - 2, max_value=2**70),
    st.floats(),
    st.text(chars, max_size=300),
    st.binary(max_size=300),
    st.binary(max_size=8).map(bytearray),
    st.fractions(),
    st.decimals(allow_nan=True),
    st.complex_numbers(),
    st.sampled_from(DTYPES).flatmap(lambda d: hnp.from_dtype(np.dtype(d))),
    hnp.arrays(st.sampled_from([np.int32, np.float64]), hnp.array_shapes(max_dims=2)),
    st.just(Hostile()),
    st.just(Stringy()),
    st.just(Fraction(1, 3)),
    st.just(Decimal("Infinity")),
)
values: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=3), kids),
    max_leaves=6,
)
# dict keys: the hashable values (no arrays, bytearrays or signalling NaN decimals)
keys = st.one_of(
    st.none(),
    st.integers(),
    st.floats(),
    st.text(chars, max_size=100),
    st.binary(max_size=100),
    st.fractions(),
    st.decimals(allow_nan=False),
    st.sampled_from(DTYPES).flatmap(lambda d: hnp.from_dtype(np.dtype(d))),
    st.just(Hostile()),
    st.just(Stringy()),
)
labels = st.one_of(
    st.none(),
    st.dictionaries(keys, values, max_size=20),
    st.lists(st.tuples(scalars, values), max_size=3),
    values,
)


@pytest.fixture(scope="module")
def listener() -> Iterator[tuple[Path, socket.socket]]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "a.sock"
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(path))
        server.listen(8)
        try:
            yield path, server
        finally:
            server.close()


@settings(deadline=None, max_examples=150)
@given(
    st.lists(
        st.tuples(st.sampled_from(["step", "phase", "label", "span"]), values, values, labels),
        min_size=1,
        max_size=4,
    )
)
def test_any_value_is_marked_or_dropped_never_raised(
    listener: tuple[Path, socket.socket], calls: list[tuple[str, Any, Any, Any]]
) -> None:
    path, server = listener
    marks = Annotator(path, reconnect_s=0.0)
    for method, first, second, extra in calls:
        if method == "step":
            marks.step(first, extra)
        elif method == "phase":
            marks.phase(first, second if isinstance(second, str) else "begin", extra)
        elif method == "label":
            marks.label(first, extra)
        else:
            with marks.span(first, extra):
                pass
    marks.close()
    # every mark dropped before a connect leaves nothing to accept
    server.settimeout(30 if marks.sent else 0.2)
    try:
        conn, _ = server.accept()
    except TimeoutError:
        assert marks.sent == 0 and marks.dropped >= len(calls)
        return
    with conn:
        conn.settimeout(10)
        data = b""
        while chunk := conn.recv(1 << 20):
            data += chunk
    lines = data.splitlines()
    assert len(lines) == marks.sent and marks.sent + marks.dropped >= len(calls)
    for line in lines:
        decode_line(line)  # raises LineError for a line the server would refuse
