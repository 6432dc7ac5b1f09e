"""bench/enter_rules.py replays gaps through enter rules: its count must be the classifier's."""

from __future__ import annotations

import pytest

from bench.enter_rules import Judge, Rule, episodes, first_flag
from tests.unit.enter_rule import ENTER_WINDOW

THRESHOLD = 0.7  # enter_rule.ENTER_WINDOW's scores are against this


@pytest.mark.parametrize(("count", "window", "scores", "starts"), ENTER_WINDOW)
def test_the_count_alone_starts_where_the_classifier_does(
    count: int, window: int, scores: list[float], starts: int | None
) -> None:
    run = [(i, s - THRESHOLD) for i, s in enumerate(scores, 1)]
    at = first_flag(run, Rule("count", count, window))
    assert (at - 1 if at is not None else None) == starts


def test_one_deep_interval_fills_an_uncapped_limit_but_not_a_capped_one() -> None:
    deep = -0.1  # 0.1 below the threshold: 0.115 with the slack, over a 0.08 limit
    assert Judge(Rule("cusum", 3, 5, slack=0.015, limit=0.08)).enters(deep)
    assert not Judge(Rule("capped", 3, 5, slack=0.015, limit=0.08, cap=0.08 / 3)).enters(deep)


def test_intervals_just_below_add_up_and_a_healthy_run_starts_nothing() -> None:
    rule = Rule("cusum", 3, 5, slack=0.015, limit=0.08)
    # One interval 0.01 below, then two 0.01 above: never 3 of 5 below ...
    run = [(i, -0.01 if i % 3 == 1 else 0.01) for i in range(1, 31)]
    assert first_flag(run, Rule("count", 3, 5)) is None
    # ... but each three add 0.025 + 0.005 + 0.005 to the deficit: 0.095 at the 7th, below.
    assert first_flag(run, rule) == 7
    assert episodes([0.04] * 1000, rule, hysteresis=0.02, exits=2) == (0, 0.0)
