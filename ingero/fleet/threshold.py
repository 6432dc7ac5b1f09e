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


def raw_thresholds(
    median: FloatArray,
    mad: FloatArray,
    k: float,
    min_margin: float,
    noise: FloatArray | None = None,
    noise_k: float = 0.0,
) -> FloatArray:
    """``median - max(k·1.4826·MAD, min_margin, noise_k·noise)``, at least 0: the margin
    never shrinks below the floor, and a wide spread (half a small group straggling: median
    0.6, MAD 0.3) gives 0, not a negative threshold, which the reply contract (a score in
    [0, 1]) cannot carry and nodes would refuse. ``noise``: each group's
    :func:`group_noise` (NaN: not known yet, no term)."""
    margin: FloatArray = np.maximum(k * MAD_SCALE * mad, min_margin)
    if noise is not None and noise_k > 0:
        margin = np.maximum(margin, np.nan_to_num(noise_k * noise, nan=0.0))
    return np.maximum(median - margin, 0.0)


# The least weight of one measurement in a node's noise (the mean of its score's change
# from one measurement to the next, weighted towards the newest): about the last 20
# measurements, so one step (a slowdown that starts, a job phase that ends) moves it by a
# twentieth of the step, and a noisier job is heard within a minute at a 1 s push. The
# first 20 changes weigh alike (a plain mean), so the first one does not stand for 20.
NOISE_ALPHA = 0.05


@dataclass(frozen=True)
class NodeNoise:
    """Per node: the score of its last measurement, its noise (NaN until two), how many
    changes that holds, and the group all belong to (a node that moves starts afresh:
    another job's scores are no measure of this one's noise)."""

    last: FloatArray
    noise: FloatArray
    count: IntArray
    gid: IntArray


def node_noise(
    prev: NodeNoise, scores: FloatArray, gids: IntArray, measured: BoolArray
) -> NodeNoise:
    """``prev`` updated with this tick's new measurements (``measured``): |score - last|
    into each node's mean, weighted max(1/count, NOISE_ALPHA)."""
    moved = gids != prev.gid
    last = np.where(moved, np.nan, prev.last)
    noise = np.where(moved, np.nan, prev.noise)
    count = np.where(moved, 0, prev.count)
    change = np.abs(scores - last)  # NaN where there is no last measurement
    counted = measured & ~np.isnan(change)
    count = np.where(counted, count + 1, count)
    weight = np.maximum(1.0 / np.maximum(count, 1), NOISE_ALPHA)
    updated = np.where(count == 1, change, noise + weight * (change - noise))
    return NodeNoise(
        last=np.where(measured, scores, last),
        noise=np.where(counted, updated, noise),
        count=count,
        gid=np.where(measured | moved, gids, prev.gid),
    )


def group_noise(noise: FloatArray, seg: IntArray, n_groups: int) -> FloatArray:
    """The median of the nodes' noise in each group (NaN where no node has one): a node
    that turns slow (its score, below its peers' median, is never clamped at 1, so it
    varies more) or one with a single deep interval cannot widen it while fewer than half
    the group are such nodes."""
    have = ~np.isnan(noise)
    median, _ = segment_median(noise[have], seg[have], n_groups)
    return median


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
