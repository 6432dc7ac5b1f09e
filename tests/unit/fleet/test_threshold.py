"""The vectorised threshold engine against straightforward per-group computations."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingero.fleet import threshold as th

scores = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
node_lists = st.lists(st.tuples(st.integers(0, 6), scores), min_size=0, max_size=60)


def by_group(pairs: list[tuple[int, float]]) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for g, v in pairs:
        out.setdefault(g, []).append(v)
    return out


def arrays(pairs: list[tuple[int, float]]) -> tuple[np.ndarray, np.ndarray]:
    seg = np.array([g for g, _ in pairs], dtype=np.int64)
    values = np.array([v for _, v in pairs], dtype=np.float64)
    return values, seg


@settings(max_examples=200, deadline=None)
@given(node_lists)
def test_segment_median_matches_statistics_median(pairs: list[tuple[int, float]]) -> None:
    values, seg = arrays(pairs)
    median, counts = th.segment_median(values, seg, 7)
    groups = by_group(pairs)
    for g in range(7):
        if g in groups:
            assert counts[g] == len(groups[g])
            assert median[g] == statistics.median(groups[g])
        else:
            assert counts[g] == 0
            assert np.isnan(median[g])


@settings(max_examples=200, deadline=None)
@given(node_lists, st.floats(0.5, 4.0), st.floats(0.0, 0.2))
def test_mad_and_raw_threshold_match_a_direct_computation(
    pairs: list[tuple[int, float]], k: float, min_margin: float
) -> None:
    values, seg = arrays(pairs)
    figs = th.group_figures(values, seg, 7)
    raw = th.raw_thresholds(figs.median, figs.mad, k, min_margin)
    for g, members in by_group(pairs).items():
        med = statistics.median(members)
        mad = statistics.median([abs(v - med) for v in members])
        assert figs.mad[g] == mad
        assert raw[g] == pytest.approx(max(0.0, med - max(k * 1.4826 * mad, min_margin)), abs=1e-12)


def test_random_groups_of_many_sizes_match() -> None:
    rng = np.random.default_rng(7)
    seg = rng.integers(0, 50, size=5000).astype(np.int64)
    values = rng.beta(8, 2, size=5000)
    figs = th.group_figures(values, seg, 52)
    for g in range(50):
        members = values[seg == g].tolist()
        med = statistics.median(members)
        assert figs.median[g] == med
        assert figs.mad[g] == statistics.median([abs(v - med) for v in members])
    assert figs.counts[50] == figs.counts[51] == 0


def test_min_margin_is_a_floor() -> None:
    median = np.array([0.9, 0.9])
    mad = np.array([0.0, 0.1])
    raw = th.raw_thresholds(median, mad, k=2.0, min_margin=0.05)
    assert raw[0] == 0.9 - 0.05  # identical scores: the floor keeps a margin
    assert raw[1] == pytest.approx(0.9 - 2.0 * 1.4826 * 0.1)


def test_ema_sequence_starts_at_raw() -> None:
    raws = [0.8, 0.6, 0.7, 0.9]
    state = np.array([np.nan])
    seen = []
    for r in raws:
        state = th.ema(state, np.array([r]), 0.2)
        seen.append(float(state[0]))
    expected = [0.8]
    for r in raws[1:]:
        expected.append(0.2 * r + 0.8 * expected[-1])
    assert seen == pytest.approx(expected, abs=1e-15)
    assert seen[0] == 0.8


@pytest.mark.parametrize(
    ("below", "active", "fraction", "panic"),
    [(2, 8, 0.25, False), (3, 8, 0.25, True), (29, 100, 0.29, False), (30, 100, 0.29, True)],
)
def test_panic_boundary(below: int, active: int, fraction: float, panic: bool) -> None:
    result = th.panic_mask(
        np.array([below]), np.array([active]), np.array([True]), panic_fraction=fraction
    )
    assert bool(result[0]) is panic


def test_no_panic_without_quorum() -> None:
    result = th.panic_mask(np.array([4]), np.array([4]), np.array([False]), panic_fraction=0.25)
    assert not result[0]


def test_classify_hysteresis_edges() -> None:
    thr = 0.8
    hyst = 0.02
    scores = np.array([thr, thr, thr + hyst, thr + hyst, 0.79, 0.81, 0.81, 0.5])
    was = np.array([False, True, True, False, False, True, False, True])
    valid = np.array([True] * 7 + [False])
    # The exit rule met by this one score alone (exit_intervals 1; tick.py counts them).
    recovered = scores >= thr + hyst
    state = th.classify(scores, np.full(8, thr), was, recovered, valid)
    assert state.tolist() == [
        False,  # equal to the threshold is not below it
        True,  # a straggler at the threshold has not recovered yet
        False,  # threshold + hysteresis recovers (the exit rule met)
        False,
        True,  # strictly below enters
        True,  # inside the band: keeps its state
        False,
        False,  # no quorum: nobody is a straggler
    ]


def test_below_counts_are_strict_and_per_group() -> None:
    scores = np.array([0.5, 0.8, 0.79, 0.9, 0.1])
    seg = np.array([0, 0, 0, 1, 2], dtype=np.int64)
    threshold = np.array([0.8, 0.95, np.nan, 0.5])  # group 2: no threshold; group 3: empty
    assert th.below_counts(scores, threshold, seg, 4).tolist() == [2, 1, 0, 0]


def test_a_wide_spread_gives_threshold_zero_never_a_negative_one() -> None:
    """Half of a small group straggling (median 0.6, MAD 0.3) once sent -0.73, which every
    node refused as outside [0, 1]; 0 says the same (nobody is below it) within the contract."""
    from ingero.otlp.threshold import ThresholdView, decode_headers, encode_headers

    raw = th.raw_thresholds(np.array([0.6]), np.array([0.3]), k=3.0, min_margin=0.05)
    assert raw[0] == 0.0
    view = ThresholdView(threshold=float(raw[0]), quorum_met=True)
    assert decode_headers(dict(encode_headers(view))) == view
