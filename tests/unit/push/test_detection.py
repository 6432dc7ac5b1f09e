"""Detection modes: age limits at their boundaries, one transition report per change."""

from __future__ import annotations

import math

import pytest

from ingero.otlp.threshold import ThresholdView
from ingero.push.config import DetectionConfig
from ingero.push.detection import CachedThreshold, DetectionSelector, LocalBaseline
from ingero.runtime.clock import ManualClock

CFG = DetectionConfig(
    fleet_max_age=15, fleet_cached_max_age=300, local_cached_max_age=3600, local_warmup=3
)


def selector(clock: ManualClock, **kw: object) -> DetectionSelector:
    return DetectionSelector(CFG, clock, **kw)  # type: ignore[arg-type]


def test_no_input_is_none() -> None:
    d = selector(ManualClock()).decide(None)
    assert (d.mode, d.threshold, d.transition) == ("none", None, (None, "none"))


@pytest.mark.parametrize(
    ("age", "mode"),
    [
        (0, "fleet"),
        (15, "fleet"),
        (15.001, "fleet-cached"),
        (300, "fleet-cached"),
        (300.001, "local-cached"),
        (3600, "local-cached"),
        (3600.001, "none"),
    ],
)
def test_fleet_threshold_ages_through_the_modes(age: float, mode: str) -> None:
    clock = ManualClock()
    s = selector(clock)
    assert s.on_fleet(ThresholdView(threshold=0.8, quorum_met=True, panic=False))
    clock.advance(age)
    d = s.decide(None)
    assert d.mode == mode
    assert d.threshold == (None if mode == "none" else 0.8)


@pytest.mark.parametrize(
    ("age", "mode"), [(0, "local-cached"), (3600, "local-cached"), (3600.5, "none")]
)
def test_persisted_threshold_is_local_cached(age: float, mode: str) -> None:
    clock = ManualClock()
    s = selector(clock, persisted=CachedThreshold(0.7, clock.now() - age))
    assert s.decide(None).mode == mode


def test_future_dated_persisted_threshold_is_not_used() -> None:
    clock = ManualClock()
    s = selector(clock, persisted=CachedThreshold(0.7, clock.now() + 10))
    assert s.decide(None).mode == "none"


@pytest.mark.parametrize(
    "reading",
    [
        ThresholdView(threshold=0.8, quorum_met=False, panic=False),
        ThresholdView(threshold=None, quorum_met=True, panic=False),
        ThresholdView(threshold=math.nan, quorum_met=True, panic=False),
        ThresholdView(threshold=1.5, quorum_met=True, panic=False),
        None,
    ],
)
def test_readings_without_a_usable_threshold_are_ignored(reading: ThresholdView | None) -> None:
    s = selector(ManualClock())
    assert not s.on_fleet(reading)
    assert s.decide(None).mode == "none"


def test_local_baseline_after_warmup_and_below_threshold_does_not_drag_it() -> None:
    s = selector(ManualClock())
    for _ in range(3):
        assert s.decide(0.9).mode == "none"
    d = s.decide(0.9)
    assert d.mode == "local-baseline"
    assert d.threshold == pytest.approx(0.8)
    for _ in range(20):
        s.decide(0.5)  # a straggler's score does not move its own baseline
    assert s.decide(None).threshold == pytest.approx(0.8)


def test_fleet_beats_local_baseline_and_each_transition_reported_once() -> None:
    clock = ManualClock()
    s = selector(clock, baseline=LocalBaseline(ema=0.9, samples=10))
    seen = []
    for step in range(400):
        if step < 5:
            s.on_fleet(ThresholdView(threshold=0.7, quorum_met=True, panic=step == 4))
        d = s.decide(0.9)
        if d.transition:
            seen.append(d.transition)
        clock.advance(5)
    assert seen == [(None, "fleet"), ("fleet", "fleet-cached"), ("fleet-cached", "local-cached")]


def test_panic_only_while_fresh() -> None:
    clock = ManualClock()
    s = selector(clock)
    s.on_fleet(ThresholdView(threshold=0.7, quorum_met=True, panic=True))
    assert s.decide(None).panic
    clock.advance(20)
    d = s.decide(None)
    assert d.mode == "fleet-cached" and not d.panic
