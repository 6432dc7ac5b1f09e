"""The margin's noise term: each node's score change from one measurement to the next, the
group's median of it, and a threshold that a noisy job's healthy nodes stay above."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from ingero.fleet import threshold as th
from ingero.fleet.config import FleetConfig, ThresholdConfig
from ingero.fleet.model import GroupStats
from ingero.fleet.state import FleetState
from ingero.otlp.health import NodePush
from ingero.runtime.clock import ManualClock

NAN = math.nan


def noise(
    last: list[float], values: list[float], gid: list[int], count: list[int] | None = None
) -> th.NodeNoise:
    counts = count or [0 if math.isnan(v) else 100 for v in values]
    return th.NodeNoise(
        np.array(last),
        np.array(values),
        np.array(counts, dtype=np.int64),
        np.array(gid, dtype=np.int64),
    )


def test_the_first_changes_are_a_mean_then_an_ema() -> None:
    prev = noise([NAN, 0.9, 0.9, 0.9], [NAN, NAN, 0.02, 0.02], [0] * 4, [0, 0, 1, 100])
    scores = np.array([0.8, 0.85, 0.8, 0.8])
    out = th.node_noise(prev, scores, np.zeros(4, dtype=np.int64), np.ones(4, dtype=np.bool_))
    # No last measurement: none yet; the first change: as it is; the second: the mean of
    # the two; after 1/NOISE_ALPHA of them, an EMA.
    assert math.isnan(out.noise[0]) and out.count[0] == 0
    assert out.noise[1] == pytest.approx(0.05) and out.count[1] == 1
    assert out.noise[2] == pytest.approx((0.02 + 0.1) / 2) and out.count[2] == 2
    assert out.noise[3] == pytest.approx(0.02 + th.NOISE_ALPHA * (0.1 - 0.02))
    assert out.last.tolist() == scores.tolist()


def test_a_tick_without_a_new_measurement_changes_nothing() -> None:
    prev = noise([0.9], [0.02], [0])
    out = th.node_noise(
        prev, np.array([0.5]), np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.bool_)
    )
    assert (out.last[0], out.noise[0], out.count[0], out.gid[0]) == (0.9, 0.02, 100, 0)


def test_a_node_that_moves_to_another_group_starts_afresh() -> None:
    prev = noise([0.9, 0.9], [0.02, 0.02], [0, 0])
    gids = np.array([1, 1], dtype=np.int64)
    out = th.node_noise(prev, np.array([0.5, 0.5]), gids, np.array([True, False]))
    # Measured in its new group: that is its first score there, no change yet.
    assert out.last[0] == 0.5 and math.isnan(out.noise[0]) and out.gid[0] == 1
    assert out.count.tolist() == [0, 0]
    # Not measured yet: nothing of the old group is kept either.
    assert math.isnan(out.last[1]) and math.isnan(out.noise[1]) and out.gid[1] == 1
    again = th.node_noise(out, np.array([0.52, 0.6]), gids, np.array([True, True]))
    assert again.noise[0] == pytest.approx(0.02) and math.isnan(again.noise[1])


def test_group_noise_is_a_median_that_a_minority_cannot_move() -> None:
    values = np.array([0.01, 0.011, 0.012, 0.5, 0.6, NAN, 0.02])
    seg = np.array([0, 0, 0, 0, 0, 0, 1], dtype=np.int64)
    out = th.group_noise(values, seg, 3)
    assert out[0] == pytest.approx(0.012)  # two wild nodes of five; one without a noise
    assert out[1] == pytest.approx(0.02)
    assert math.isnan(out[2])


def test_the_noise_term_is_a_floor_of_the_margin() -> None:
    median = np.array([0.9, 0.9, 0.9])
    mad = np.array([0.0, 0.0, 0.05])
    group = np.array([0.02, NAN, 0.02])
    raw = th.raw_thresholds(median, mad, 2.0, 0.04, group, 3.0)
    # 3 x 0.02 over min_margin; no noise known: min_margin; a wider MAD term wins.
    assert raw.tolist() == pytest.approx([0.84, 0.86, 0.9 - 2 * th.MAD_SCALE * 0.05])
    assert th.raw_thresholds(median, mad, 2.0, 0.04, group, 0.0).tolist() == pytest.approx(
        th.raw_thresholds(median, mad, 2.0, 0.04).tolist()
    )


def _noisy_job(noise_k: float, ticks: int, slow: float = 0.0) -> tuple[int, set[str], GroupStats]:
    """Eight nodes whose scores drop below 0.9 by 0.03 (sd) of noise half the time and
    are 0.9 the other half, as a healthy node's are (its rate above its peers' median
    scores 1, clamped), the last one ``slow`` lower, under Fleet's default rules but
    ``noise_k``: (straggler episodes begun, the nodes they were of, the last group
    figures)."""
    config = FleetConfig(threshold=ThresholdConfig(noise_k=noise_k))
    clock = ManualClock()
    state = FleetState(config, clock)
    rng = random.Random(7)
    started = 0
    nodes: set[str] = set()
    group = None
    for _ in range(ticks):
        for i in range(8):
            score = 0.9 - (slow if i == 7 else 0.0) + min(rng.gauss(0.0, 0.03), 0.0)
            state.ingest(
                NodePush(
                    node_id=f"n{i}", cluster_id="c", score=min(score, 1.0), job_id="9", held=False
                )
            )
        result = state.tick()
        begun = [e for e in result.events if e.type == "straggler_state"]
        started += len(begun)
        nodes |= {e.node_id for e in begun}
        (group,) = result.groups
        clock.advance(1.0)
    assert group is not None
    return started, nodes, group


def test_a_noisy_jobs_healthy_nodes_are_not_flagged() -> None:
    # As noisy as 5% per second on a node without GPU rows at a 1 s push
    # (docs/benchmarks.md#a-noisier-job): the MAD stays small (half the scores sit at the top), the
    # margin is min_margin (0.04), and healthy nodes straggle.
    alone, _, _ = _noisy_job(0.0, 600)
    assert alone > 5
    started, _, group = _noisy_job(ThresholdConfig().noise_k, 600)
    assert started == 0
    # The margin is noise_k times the group's noise, well over min_margin.
    assert group.median is not None and group.raw_threshold is not None
    assert group.noise is not None and 3 * group.noise > 0.05
    assert group.median - group.raw_threshold == pytest.approx(3 * group.noise)


def test_a_clear_straggler_in_a_noisy_job_is_still_flagged() -> None:
    # Its own changes are as noisy as its peers': the median over eight is theirs.
    started, nodes, _ = _noisy_job(ThresholdConfig().noise_k, 120, slow=0.15)
    assert nodes == {"n7"} and started >= 1
