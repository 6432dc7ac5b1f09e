"""The clock offset of a node from several (arrival, printed time) samples: the least
delayed one wins, so a host that stalls while some lines wait cannot skew it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingero.fanout.ssh import least_delayed_offset

CASES = [
    # (samples as (arrival, line), expected offset), the node 2.0 s ahead of this host
    ([(100.001, b"102.0")], 1.999),
    # this host stalled until 100.15: the lines printed until then arrive together, late;
    # the next ones a millisecond after they were printed
    ([(100.15, b"102.0"), (100.15, b"102.14"), (100.161, b"102.16"), (100.181, b"102.18")], 1.999),
    # two lines read in one chunk share an arrival: the later-printed one is nearer
    ([(100.05, b"102.0"), (100.05, b"102.049\n")], 1.999),
    # a line that is not a time (a shell's warning, a truncated line) is skipped
    ([(100.0, b"sh: warning"), (100.002, b"102.001"), (100.1, b"nan"), (100.2, b"inf")], 1.999),
    # behind this host's clock
    ([(100.3, b"99.5"), (100.021, b"99.52")], -0.501),
]


@pytest.mark.parametrize(("samples", "expected"), CASES)
def test_the_least_delayed_sample_sets_the_offset(
    samples: list[tuple[float, bytes]], expected: float
) -> None:
    got = least_delayed_offset(samples)
    assert got is not None and got == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("samples", [[], [(1.0, b"")], [(1.0, b"Mon Nov 28")]])
def test_no_time_no_offset(samples: list[tuple[float, bytes]]) -> None:
    assert least_delayed_offset(samples) is None


@given(
    st.floats(-1e4, 1e4),
    st.lists(st.tuples(st.floats(0, 1e3), st.floats(0, 5)), min_size=1, max_size=20),
)
def test_never_past_the_true_offset_and_exact_at_the_least_delay(
    offset: float, lines: list[tuple[float, float]]
) -> None:
    """Each line printed at node time ``t`` (this host's ``t - offset``) and read ``delay``
    later: the estimate is the true offset less the smallest delay."""
    samples = [(t - offset + delay, repr(t).encode()) for t, delay in lines]
    got = least_delayed_offset(samples)
    assert got is not None
    least = min(delay for _, delay in lines)
    assert got == pytest.approx(offset - least, abs=1e-6)
