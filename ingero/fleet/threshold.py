"""Peer-relative thresholds, vectorised over all groups at once (pure numpy, no I/O).

Every function takes flat arrays: one value per node plus the index of the node's group
(``seg``, 0 ≤ seg < n_groups). Groups are processed segment-wise after one sort, so a tick
over 100,000 nodes in 1,000 groups costs a few sorts, not a Python loop per group.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

# Scales the MAD to a consistent estimator of the standard deviation under normality.
MAD_SCALE = 1.4826

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class GroupFigures:
    """Per-group robust statistics; NaN where a group has no value."""

    counts: IntArray
    median: FloatArray
    mad: FloatArray


def segment_median(values: FloatArray, seg: IntArray, n_groups: int) -> tuple[FloatArray, IntArray]:
    """Median of ``values`` within each group, and the group sizes.

    Even-sized groups take the mean of the two middle values, as ``statistics.median`` does.
    """
    counts = np.bincount(seg, minlength=n_groups).astype(np.int64)
    median = np.full(n_groups, np.nan)
    if values.size == 0:
        return median, counts
    # lexsort: the last key is primary, so values end up sorted within each group.
    ordered = values[np.lexsort((values, seg))]
    starts = np.cumsum(counts) - counts
    present = counts > 0
    lo = (starts + (counts - 1) // 2)[present]
    hi = (starts + counts // 2)[present]
    median[present] = (ordered[lo] + ordered[hi]) / 2.0
    return median, counts


def group_figures(values: FloatArray, seg: IntArray, n_groups: int) -> GroupFigures:
    """Median and median absolute deviation (unscaled) of each group."""
    median, counts = segment_median(values, seg, n_groups)
    deviations = np.abs(values - median[seg]) if values.size else values
    mad, _ = segment_median(deviations, seg, n_groups)
    return GroupFigures(counts=counts, median=median, mad=mad)


def raw_thresholds(median: FloatArray, mad: FloatArray, k: float, min_margin: float) -> FloatArray:
    """``median - max(k·1.4826·MAD, min_margin)``, at least 0: the margin never shrinks below
    the floor, and a wide spread (half a small group straggling: median 0.6, MAD 0.3) gives 0,
    not a negative threshold, which the reply contract (a score in [0, 1]) cannot carry and
    nodes would refuse."""
    margin: FloatArray = np.maximum(k * MAD_SCALE * mad, min_margin)
    return np.maximum(median - margin, 0.0)


def ema(previous: FloatArray, raw: FloatArray, alpha: float) -> FloatArray:
    """Exponential moving average; where there is no previous value (NaN) it starts at ``raw``."""
    smoothed: FloatArray = alpha * raw + (1.0 - alpha) * previous
    return np.where(np.isnan(previous), raw, smoothed)


def below_counts(
    scores: FloatArray, threshold: FloatArray, seg: IntArray, n_groups: int
) -> IntArray:
    """How many nodes of each group score strictly below the group's threshold."""
    return np.bincount(seg[scores < threshold[seg]], minlength=n_groups).astype(np.int64)


def panic_mask(
    below: IntArray, active: IntArray, quorum: BoolArray, panic_fraction: float
) -> BoolArray:
    """Groups with quorum where more than ``panic_fraction`` of the active nodes are below.

    The share is a correctly rounded division, so a share exactly equal to the configured
    fraction (2 of 8 at 0.25, 29 of 100 at 0.29) compares equal and is not panic.
    """
    share = below / np.maximum(active, 1)
    result: BoolArray = quorum & (share > panic_fraction)
    return result


def classify(
    scores: FloatArray,
    threshold: FloatArray,
    was_straggler: BoolArray,
    recovered: BoolArray,
    valid: BoolArray,
) -> BoolArray:
    """Straggler state per node, with hysteresis.

    A node becomes a straggler when its score is strictly below the threshold and stays
    one until ``recovered`` (the caller's exit rule: its score at ``threshold +
    hysteresis`` long enough); in between it keeps its state. Where ``valid`` is false
    (no quorum) nobody is a straggler.
    """
    below = scores < threshold
    state: BoolArray = valid & (below | (was_straggler & ~recovered))
    return state
