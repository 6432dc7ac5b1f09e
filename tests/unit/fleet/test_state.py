"""FleetState: the score map, its ticks, straggler episodes and events (driven by ManualClock)."""

from __future__ import annotations

import math
import statistics
import threading
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingero.fleet.config import FleetConfig, LimitsConfig, QuorumConfig, ThresholdConfig
from ingero.fleet.model import CapacityError, TickResult
from ingero.fleet.state import FleetState
from ingero.otlp.health import NodePush
from ingero.otlp.threshold import ENTER_INTERVALS, EXIT_INTERVALS, ThresholdView
from ingero.runtime.clock import ManualClock
from ingero.schema.events import Event
from tests.unit.enter_rule import ENTER_WINDOW
from tests.unit.exit_rule import EXIT_RULES

JOB = "42"
MARGIN = ThresholdConfig().min_margin  # the default: with MAD 0, threshold = median - it


def make(
    *,
    ema_alpha: float = 1.0,
    max_nodes: int = 100_000,
    quorum: QuorumConfig | None = None,
    enter_intervals: int = 1,
    exit_intervals: int = 1,
    noise_k: float = ThresholdConfig().noise_k,
) -> tuple[FleetState, ManualClock, FleetConfig]:
    """A state with default rules, except ema_alpha 1 (threshold = this tick's raw one),
    enter_intervals 1 (an episode starts on the first tick below) and exit_intervals 1
    (it ends on the first tick at the recovery level; the enter and exit rules have their
    own tests)."""
    config = FleetConfig(
        threshold=ThresholdConfig(
            ema_alpha=ema_alpha,
            enter_intervals=enter_intervals,
            exit_intervals=exit_intervals,
            noise_k=noise_k,
        ),
        quorum=quorum or QuorumConfig(),
        limits=LimitsConfig(max_nodes=max_nodes),
    )
    clock = ManualClock()
    return FleetState(config, clock), clock, config


def push(
    node: str, score: float, job: str | None = JOB, cluster: str = "c1", **kw: object
) -> NodePush:
    return NodePush(node_id=node, cluster_id=cluster, score=score, job_id=job, **kw)  # type: ignore[arg-type]


def feed(state: FleetState, scores: dict[str, float], job: str | None = JOB) -> None:
    for node, score in scores.items():
        state.ingest(push(node, score, job))


def healthy(n: int, score: float = 0.9) -> dict[str, float]:
    return {f"n{i}": score for i in range(n)}


def of_type(result: TickResult, kind: str) -> list[Event]:
    return [e for e in result.events if e.type == kind]


# ---- scenarios -----------------------------------------------------------------------


def test_one_straggler_among_eight() -> None:
    state, clock, _ = make()
    scores = {f"n{i}": 0.90 + 0.002 * i for i in range(8)}
    scores["n3"] = 0.40
    feed(state, scores)
    state.ingest(push("n3", 0.40, rank=3, dominant_signal="throughput"))
    result = state.tick()
    (event,) = result.events
    assert event.type == "straggler_state"
    assert (event.node_id, event.cluster_id, event.job_id, event.rank) == ("n3", "c1", JOB, 3)
    assert event.detection_mode == "fleet"
    assert event.dominant_signal == "throughput"
    assert event.score == 0.40
    assert event.extra["panic"] is False
    (group,) = result.groups
    assert group.quorum_met and not group.panic
    assert group.active_nodes == 8 and group.straggler_count == 1
    assert event.threshold == group.threshold
    (verdict,) = result.verdicts
    assert verdict.node_id == "n3" and verdict.consecutive_straggler_ticks == 1
    assert verdict.since == clock.now() and verdict.event_id == event.event_id
    assert verdict.reason == "score" and verdict.peer_lag is None


@pytest.mark.parametrize(
    ("pushed", "signal", "expected"),
    [
        ("network", "throughput", "network"),  # what the node says of itself wins
        ("job", "gpu_health", "job"),
        (None, "gpu_health", "hardware"),  # an agent that says nothing: its signal tells
        (None, "cpu", "node"),
        (None, "throughput", "unknown"),
    ],
)
def test_a_straggler_carries_its_cause_class(
    pushed: str | None, signal: str, expected: str
) -> None:
    state, _, _ = make()
    feed(state, {f"n{i}": 0.90 + 0.002 * i for i in range(8)})
    state.ingest(push("n3", 0.40, rank=3, dominant_signal=signal, cause_class=pushed))
    result = state.tick()
    (event,) = of_type(result, "straggler_state")
    assert event.extra["cause_class"] == expected
    (verdict,) = result.verdicts
    assert verdict.cause_class == expected


def test_default_config_flags_a_node_that_slows_down_mid_job() -> None:
    state = FleetState(FleetConfig(), clock := ManualClock())
    base = {f"n{i}": 0.90 + 0.004 * (i % 3) for i in range(8)}
    for _ in range(5):
        feed(state, base)
        assert state.tick().events == ()
        clock.advance(5)
    # A 20% slowdown of one node. Fewer ticks below than the default enter rule's (fleet-push's,
    # ENTER_INTERVALS) are not yet an episode.
    for _ in range(ENTER_INTERVALS - 1):
        feed(state, {**base, "n5": 0.70})
        assert state.tick().events == ()
        clock.advance(5)
    feed(state, {**base, "n5": 0.70})
    result = state.tick()
    assert [(e.type, e.node_id) for e in result.events] == [("straggler_state", "n5")]
    assert result.groups[0].quorum_met and not result.groups[0].panic
    assert result.verdicts[0].consecutive_straggler_ticks == 1


def test_two_stragglers_among_eight_is_not_panic() -> None:
    state, _, _ = make()
    scores = healthy(8)
    scores["n0"] = scores["n1"] = 0.3
    feed(state, scores)
    result = state.tick()
    assert sorted(e.node_id for e in of_type(result, "straggler_state")) == ["n0", "n1"]
    assert not of_type(result, "group_degraded")  # 2/8 is exactly panic_fraction, not above
    assert all(v.panic is False for v in result.verdicts)


def test_forty_percent_slow_is_one_group_degraded_and_panic_events() -> None:
    state, clock, _ = make()
    scores = healthy(10)
    for i in range(4):
        scores[f"n{i}"] = 0.3
    feed(state, scores)
    first = state.tick()
    (degraded,) = of_type(first, "group_degraded")
    assert degraded.job_id == JOB and degraded.extra["panic"] is True
    assert degraded.extra["below_nodes"] == 4 and degraded.extra["active_nodes"] == 10
    stragglers = of_type(first, "straggler_state")
    assert len(stragglers) == 4
    assert all(e.extra["panic"] is True for e in stragglers)
    assert all(v.panic for v in first.verdicts)
    view = state.threshold_view("c1", JOB)
    assert view is not None and view.panic
    for _ in range(3):
        clock.advance(5)
        feed(state, scores)
        again = state.tick()
        assert not of_type(again, "group_degraded")  # once per episode
        assert again.groups[0].panic
    # The episode ends, then a new one begins: one more group_degraded.
    clock.advance(5)
    feed(state, healthy(10))
    calm = state.tick()
    assert not calm.groups[0].panic
    assert len(of_type(calm, "straggler_resolved")) == 4
    clock.advance(5)
    feed(state, scores)
    assert len(of_type(state.tick(), "group_degraded")) == 1


def test_fewer_nodes_than_quorum_gives_no_straggler_events() -> None:
    state, _, _ = make()
    scores = healthy(4)
    scores["n0"] = 0.1
    feed(state, scores)
    result = state.tick()
    assert result.events == () and result.verdicts == ()
    (group,) = result.groups
    assert not group.quorum_met and group.threshold is not None  # computed, for metrics
    view = state.threshold_view("c1", JOB)
    assert view is not None and view.threshold is None and not view.quorum_met
    assert view.median == group.median


def test_quorum_boundary_four_vs_five() -> None:
    for n, expect in ((4, 0), (5, 1)):
        state, _, _ = make()
        scores = healthy(n)
        scores["n0"] = 0.1
        feed(state, scores)
        result = state.tick()
        assert len(of_type(result, "straggler_state")) == expect
        assert result.groups[0].quorum_met is bool(expect)


def test_two_clusters_with_the_same_node_ids_keep_their_own_nodes() -> None:
    """Every Slurm site may name a node n3: a node is (cluster, node id), so pushes of two
    clusters' n3 never move one another between groups (no flapping), and each keeps its own
    group, threshold, episode and expiry."""
    state, clock, config = make()
    a = healthy(8)
    a["n3"] = 0.4
    b = {f"n{i}": 0.5 + 0.01 * i for i in range(8)}  # a lower median, and no straggler

    def both() -> dict[str, tuple[ThresholdView, ThresholdView]]:
        return {
            n: (state.ingest(push(n, a[n])), state.ingest(push(n, b[n], cluster="c2"))) for n in a
        }

    both()
    first = state.tick()
    assert state.node_count() == 16
    assert {g.group: g.active_nodes for g in first.groups} == {"c1/job/42": 8, "c2/job/42": 8}
    (started,) = of_type(first, "straggler_state")
    assert [(v.cluster_id, v.node_id) for v in first.verdicts] == [("c1", "n3")]
    view_a, view_b = state.threshold_view("c1", JOB), state.threshold_view("c2", JOB)
    assert view_a is not None and view_b is not None
    assert view_a.median == pytest.approx(0.9) and view_b.median == pytest.approx(0.535)
    # Only A's n3 hears of A's episode, in its reply and in an API read.
    reply_a, reply_b = both()["n3"]
    assert reply_a.episode_id == started.event_id and reply_b.episode_id is None
    read_b = state.threshold_view("c2", JOB, node_id="n3")
    assert read_b is not None and read_b.episode_id is None
    read_a = state.threshold_view("c1", JOB, node_id="n3")
    assert read_a is not None and read_a.episode_id == started.event_id
    second = state.tick()
    assert second.events == ()  # nothing flapped: no episode ended, none began
    assert {g.group: g.active_nodes for g in second.groups} == {"c1/job/42": 8, "c2/job/42": 8}
    # B falls silent: B's nodes expire, A's n3 (same id) keeps its slot and its episode.
    clock.advance(config.node_ttl)
    feed(state, a)
    third = state.tick()
    assert third.expired_nodes == tuple(("c2", f"n{i}") for i in range(8))
    assert of_type(third, "straggler_resolved") == []
    assert [(v.cluster_id, v.node_id, v.event_id) for v in third.verdicts] == [
        ("c1", "n3", started.event_id)
    ]
    assert state.node_count() == 8


def test_two_jobs_in_one_cluster_have_separate_thresholds() -> None:
    state, _, _ = make()
    feed(state, {f"a{i}": 0.9 for i in range(6)}, job="1")
    feed(state, {f"b{i}": 0.5 for i in range(6)}, job="2")
    result = state.tick()
    assert result.events == ()  # 0.5 is only slow compared with job 1, not within job 2
    one, two = state.threshold_view("c1", "1"), state.threshold_view("c1", "2")
    assert one is not None and two is not None
    assert one.group != two.group
    assert one.threshold == pytest.approx(0.9 - MARGIN)
    assert two.threshold == pytest.approx(0.5 - MARGIN)


def test_groups_without_job_are_per_workload_type() -> None:
    state, _, _ = make()
    for i in range(5):
        state.ingest(push(f"t{i}", 0.9, job=None, workload_type="training"))
        state.ingest(push(f"i{i}", 0.6, job=None, workload_type="inference"))
    state.tick()
    train = state.threshold_view("c1", workload_type="training")
    infer = state.threshold_view("c1", workload_type="inference")
    assert train is not None and infer is not None
    assert train.median == 0.9 and infer.median == 0.6
    assert state.threshold_view("c1", "nope") is None
    assert state.group_count() == 2


# ---- rules ---------------------------------------------------------------------------


def test_ingest_returns_the_view_of_the_last_tick() -> None:
    state, clock, _ = make()
    before = state.ingest(push("n0", 0.9))
    assert before.threshold is None and before.computed_at is None and not before.quorum_met
    feed(state, healthy(6))
    state.tick()
    clock.advance(5)
    view = state.ingest(push("n0", 0.1))  # no statistics on the hot path
    assert view.threshold == pytest.approx(0.9 - MARGIN)
    assert view.quorum_met and view.active_nodes == 6
    assert view.computed_at == clock.now() - 5


def test_ema_smooths_across_ticks_and_restarts_after_quorum_loss() -> None:
    # The whole group moves by 0.1 a tick, which the noise term would take for noise.
    state, clock, _ = make(ema_alpha=0.2, noise_k=0.0)
    medians = [0.9, 0.8, 0.7, 0.95]
    expected: list[float] = []
    for m in medians:
        feed(state, healthy(6, m))
        group = state.tick().groups[0]
        raw = m - MARGIN
        expected.append(raw if not expected else 0.2 * raw + 0.8 * expected[-1])
        assert group.raw_threshold == pytest.approx(raw)
        assert group.threshold == pytest.approx(expected[-1])
        clock.advance(5)
    # Drop to 4 active nodes: no quorum, EMA forgotten; back to 6: starts again at raw.
    for i in (4, 5):
        state.ingest(push(f"n{i}", 0.9, state="idle"))
    lost = state.tick().groups[0]
    assert not lost.quorum_met and lost.threshold == pytest.approx(0.95 - MARGIN)
    clock.advance(5)
    feed(state, healthy(6, 0.6))
    assert state.tick().groups[0].threshold == pytest.approx(0.6 - MARGIN)


def test_hysteresis_edges_in_state() -> None:
    state, clock, config = make()
    scores = healthy(8)
    scores["n7"] = 0.5
    feed(state, scores)
    thr = state.tick().groups[0].threshold
    assert thr is not None
    # 7 nodes at 0.9 fix median 0.9 and MAD 0, so thr stays 0.9 - min_margin.
    assert thr == 0.9 - MARGIN
    hyst = config.threshold.hysteresis
    steps = [
        (thr, True, 0),  # equal to the threshold: still a straggler (not yet recovered)
        (thr + hyst / 2, True, 0),  # inside the band
        (thr + hyst, False, 1),  # recovered exactly at threshold + hysteresis
        (thr, False, 0),  # equal to the threshold does not enter
        (thr + hyst / 2, False, 0),
    ]
    for score, straggler, resolved in steps:
        clock.advance(5)
        feed(state, healthy(7))
        state.ingest(push("n7", score))
        result = state.tick()
        assert result.groups[0].threshold == thr
        assert any(v.node_id == "n7" for v in result.verdicts) is straggler
        assert len(of_type(result, "straggler_resolved")) == resolved


def test_consecutive_ticks_count_and_reset_with_one_episode_id() -> None:
    state, clock, _ = make()
    scores = healthy(8)
    scores["n7"] = 0.5
    started = clock.now()
    ids = set()
    for expect in (1, 2, 3):
        feed(state, scores)
        result = state.tick()
        (verdict,) = result.verdicts
        assert verdict.consecutive_straggler_ticks == expect and verdict.since == started
        ids.add(verdict.event_id)
        clock.advance(5)
    assert len(ids) == 1
    feed(state, healthy(8))
    result = state.tick()
    (resolved,) = result.events
    assert resolved.type == "straggler_resolved" and resolved.event_id in ids
    assert resolved.extra["reason"] == "recovered" and resolved.extra["since"] == started
    assert result.verdicts == ()
    clock.advance(5)
    feed(state, scores)
    (again,) = state.tick().verdicts
    assert again.consecutive_straggler_ticks == 1 and again.since == clock.now()
    assert again.event_id not in ids  # a new episode gets a new id


@pytest.mark.parametrize(("count", "window", "scores", "enters"), ENTER_WINDOW)
def test_an_episode_starts_after_enter_intervals_below_within_the_enter_window(
    count: int, window: int, scores: list[float], enters: int | None
) -> None:
    """Fleet's enter rule is fleet-push's (push/test_classifier.py has the same table)."""
    config = FleetConfig(
        threshold=ThresholdConfig(ema_alpha=1.0, enter_intervals=count, enter_window=window)
    )
    clock = ManualClock()
    state = FleetState(config, clock)
    entered = []
    for score in scores:
        feed(state, {**healthy(8), "n7": score})
        entered.append(bool(of_type(state.tick(), "straggler_state")))
        clock.advance(5)
    assert entered == [i == enters for i in range(len(scores))]


def test_a_held_push_does_not_count_again_in_the_enter_window() -> None:
    """The tracer slower than the pushes: each measurement comes once new, then once held.
    Two measurements below, each pushed twice, are two of the default enter rule's (3 of
    the last 5), not four; a third new one below starts the episode. The held node stays in
    its group (quorum of 5 with it) and its score in the median."""
    state = FleetState(
        FleetConfig(threshold=ThresholdConfig(ema_alpha=1.0)), clock := ManualClock()
    )
    entered = []
    for score, held in [(0.9, False), (0.5, False), (0.5, True), (0.5, False), (0.5, True)]:
        feed(state, healthy(4))
        state.ingest(push("n7", score, held=held))
        result = state.tick()
        assert result.groups[0].quorum_met and result.groups[0].active_nodes == 5
        entered.append(bool(of_type(result, "straggler_state")))
        clock.advance(1)
    assert entered == [False] * 5
    feed(state, healthy(4))
    state.ingest(push("n7", 0.5))
    assert [e.node_id for e in of_type(state.tick(), "straggler_state")] == ["n7"]


def test_a_tick_without_a_new_measurement_does_not_count_a_score_again() -> None:
    """A node that says whether its pushes hold is counted once per new measurement, also
    at a tick without its push; one that does not say (an older agent) at every tick."""
    state, clock, _ = make(enter_intervals=2)
    feed(state, healthy(6))
    state.ingest(push("n6", 0.5))  # says nothing
    state.ingest(push("n7", 0.5, held=False))
    assert state.tick().events == ()
    feed(state, healthy(6))  # n6 and n7 silent: their last scores count again for n6 only
    assert [e.node_id for e in state.tick().events] == ["n6"]
    state.ingest(push("n7", 0.5, held=True))
    feed(state, healthy(6))
    assert state.tick().events == ()
    state.ingest(push("n7", 0.5, held=False))
    feed(state, healthy(6))
    (entered,) = state.tick().events
    assert (entered.type, entered.node_id) == ("straggler_state", "n7")
    # An open episode goes on over ticks without a new measurement.
    for _ in range(2):
        clock.advance(1)
        feed(state, healthy(6))
        assert "n7" in [v.node_id for v in state.tick().verdicts]
    state.ingest(push("n7", 0.9, held=False))
    feed(state, healthy(6))
    (resolved,) = [e for e in state.tick().events if e.node_id == "n7"]
    assert resolved.type == "straggler_resolved" and resolved.extra["reason"] == "recovered"


# The letters of tests/unit/exit_rule.py for n7 among eight nodes at 0.9: threshold 0.86
# (median 0.9 - min_margin 0.04), recovery at 0.88 (hysteresis 0.02).
LEVEL = {"b": 0.5, "h": 0.87, "u": 0.9}


@pytest.mark.parametrize(("count", "steps", "ends"), EXIT_RULES)
def test_an_episode_ends_after_exit_intervals_measured_ticks_at_the_recovery_level(
    count: int, steps: str, ends: int | None
) -> None:
    """Fleet's exit rule is fleet-push's (push/test_classifier.py has the same table)."""
    state, clock, _ = make(exit_intervals=count)
    feed(state, {**healthy(8), "n7": 0.5})
    (entered,) = of_type(state.tick(), "straggler_state")
    assert entered.threshold == pytest.approx(0.86)
    ended = []
    for step in steps:
        clock.advance(5)
        feed(state, {**healthy(8), "n7": LEVEL[step]})
        result = state.tick()
        assert not of_type(result, "straggler_state")  # the same episode all along
        resolved = of_type(result, "straggler_resolved")
        assert all(e.extra["reason"] == "recovered" for e in resolved)
        ended.append(bool(resolved))
    assert ended == [i == ends for i in range(len(steps))]


def test_the_default_exit_rule_outlasts_one_noisy_tick() -> None:
    """A node below its threshold with one tick above: the same episode goes on."""
    state, clock, _ = make(exit_intervals=ThresholdConfig().exit_intervals)
    feed(state, {**healthy(8), "n7": 0.85})
    (entered,) = of_type(state.tick(), "straggler_state")
    for score in (0.9, 0.85, 0.85):
        clock.advance(5)
        feed(state, {**healthy(8), "n7": score})
        result = state.tick()
        assert result.events == () and result.verdicts[0].event_id == entered.event_id
    for _ in range(EXIT_INTERVALS):
        clock.advance(5)
        feed(state, healthy(9))
        result = state.tick()
    assert [e.type for e in result.events] == ["straggler_resolved"]


def test_a_held_push_does_not_count_again_towards_the_exit() -> None:
    """One measurement at the recovery level, pushed new then held, is one of the two
    exit_intervals 2 wants; a second new one ends the episode."""
    state, clock, _ = make(exit_intervals=2)
    feed(state, healthy(8))
    state.ingest(push("n7", 0.5, held=False))
    assert of_type(state.tick(), "straggler_state")
    for held in (False, True, True):
        clock.advance(1)
        feed(state, healthy(8))
        state.ingest(push("n7", 0.9, held=held))
        assert state.tick().events == ()
    clock.advance(1)
    feed(state, healthy(8))
    state.ingest(push("n7", 0.9, held=False))
    (resolved,) = state.tick().events
    assert resolved.type == "straggler_resolved" and resolved.extra["reason"] == "recovered"


@pytest.mark.parametrize(
    ("last", "reason"),
    [
        (push("n7", 0.9, job=None), "job_ended"),
        (push("n7", 0.9, job="43"), "group_changed"),
        (push("n7", 0.9, state="idle"), "inactive"),
        (push("n7", 0.9, state="stale"), "inactive"),
    ],
)
def test_ends_that_are_not_measurements_come_at_once(last: NodePush, reason: str) -> None:
    """Whatever the exit count: the node's job ended or moved, the node is not active."""
    state, clock, _ = make(exit_intervals=3)
    feed(state, {**healthy(8), "n7": 0.5})
    (entered,) = of_type(state.tick(), "straggler_state")
    clock.advance(5)
    feed(state, {**healthy(8), "n7": 0.9})  # one tick of three towards recovery
    assert state.tick().events == ()
    clock.advance(5)
    feed(state, healthy(8))
    state.ingest(last)
    (resolved,) = of_type(state.tick(), "straggler_resolved")
    assert resolved.event_id == entered.event_id and resolved.extra["reason"] == reason


def test_losing_quorum_ends_an_episode_at_once() -> None:
    state, clock, _ = make(exit_intervals=3)
    feed(state, {**healthy(4), "n4": 0.2})
    assert of_type(state.tick(), "straggler_state")
    clock.advance(5)
    feed(state, {**healthy(4), "n4": 0.9})
    assert state.tick().events == ()
    clock.advance(5)
    feed(state, {**healthy(3), "n4": 0.9})
    state.ingest(push("n3", 0.9, state="stale"))
    (resolved,) = state.tick().events
    assert resolved.extra["reason"] == "quorum_lost"


def test_losing_quorum_ends_episodes() -> None:
    state, clock, _ = make()
    scores = healthy(5)
    scores["n4"] = 0.2
    feed(state, scores)
    (entered,) = state.tick().events
    clock.advance(5)
    feed(state, scores)
    state.ingest(push("n0", 0.9, state="stale"))
    result = state.tick()
    (resolved,) = result.events
    assert resolved.type == "straggler_resolved" and resolved.event_id == entered.event_id
    assert resolved.extra["reason"] == "quorum_lost"
    assert result.verdicts == () and not result.groups[0].quorum_met


def test_idle_nodes_leave_the_statistics() -> None:
    state, clock, _ = make()
    feed(state, healthy(6))
    state.ingest(push("n0", 0.2))
    state.tick()
    clock.advance(5)
    for i in range(6, 9):
        state.ingest(push(f"n{i}", 0.0, state="idle"))
    state.ingest(push("n0", 0.2, state="idle"))  # the straggler's job went idle
    result = state.tick()
    (group,) = result.groups
    assert group.active_nodes == 5 and group.idle_nodes == 4 and group.tracked_nodes == 9
    assert group.median == 0.9
    (resolved,) = result.events
    assert resolved.type == "straggler_resolved" and resolved.extra["reason"] == "inactive"
    calibrating = state.ingest(push("n1", 0.0, state="calibrating"))
    assert calibrating.active_nodes == 5
    clock.advance(5)
    assert state.tick().groups[0].active_nodes == 4


def test_expiry_exactly_at_ttl() -> None:
    state, clock, config = make()
    scores = healthy(6)
    scores["n5"] = 0.2
    feed(state, scores)
    first = state.tick()
    (entered,) = first.events
    ttl = config.node_ttl
    assert ttl == 25.0
    clock.advance(ttl - 1)
    feed(state, healthy(5))  # n5 falls silent
    assert state.tick().expired_nodes == ()
    clock.advance(0.5)
    assert state.tick().expired_nodes == ()  # silent for ttl - 0.5
    clock.advance(0.5)
    result = state.tick()  # silent for exactly ttl
    assert result.expired_nodes == (("c1", "n5"),)
    (resolved,) = result.events
    assert resolved.extra["reason"] == "expired" and resolved.event_id == entered.event_id
    assert state.node_count() == 5
    assert state.groups_snapshot()[0].active_nodes == 5


def test_node_moving_to_a_new_job_moves_groups() -> None:
    state, clock, _ = make()
    feed(state, healthy(6), job="1")
    feed(state, {f"m{i}": 0.9 for i in range(5)}, job="2")
    state.ingest(push("n0", 0.2, job="1"))
    state.tick()
    clock.advance(5)
    state.ingest(push("n0", 0.9, job="2"))
    result = state.tick()
    counts = {g.job_id: g.active_nodes for g in result.groups}
    assert counts == {"1": 5, "2": 6}
    (resolved,) = result.events
    assert resolved.extra["reason"] == "group_changed" and resolved.job_id == "1"
    # The old job's group disappears once nothing belongs to it.
    clock.advance(5)
    for i in range(1, 6):
        state.ingest(push(f"n{i}", 0.9, job="3"))
    state.tick()
    assert state.threshold_view("c1", "1") is None
    assert state.group_count() == 2


def test_a_straggler_moving_while_slow_starts_a_new_episode_in_its_new_group() -> None:
    state, clock, _ = make()
    feed(state, healthy(6), job="1")
    feed(state, {f"m{i}": 0.9 for i in range(5)}, job="2")
    state.ingest(push("n0", 0.2, job="1"))
    (entered,) = state.tick().events
    clock.advance(5)
    feed(state, healthy(6), job="1")
    feed(state, {f"m{i}": 0.9 for i in range(5)}, job="2")
    state.ingest(push("n0", 0.2, job="2"))
    result = state.tick()
    resolved = of_type(result, "straggler_resolved")
    started = of_type(result, "straggler_state")
    assert [e.event_id for e in resolved] == [entered.event_id]
    assert resolved[0].extra["reason"] == "group_changed" and resolved[0].job_id == "1"
    assert len(started) == 1 and started[0].job_id == "2"
    assert started[0].event_id != entered.event_id
    (verdict,) = result.verdicts
    assert verdict.job_id == "2" and verdict.consecutive_straggler_ticks == 1


def test_capacity_cap_refuses_only_new_nodes() -> None:
    state, clock, config = make(max_nodes=3)
    feed(state, healthy(3))
    with pytest.raises(CapacityError, match="max_nodes"):
        state.ingest(push("n3", 0.9))
    state.ingest(push("n0", 0.4))  # known nodes still update
    assert state.node_count() == 3
    clock.advance(config.node_ttl)
    state.ingest(push("n1", 0.9))
    assert state.tick().expired_nodes == (("c1", "n0"), ("c1", "n2"))
    state.ingest(push("n3", 0.9))  # room again after expiry
    assert state.node_count() == 2


def test_peer_groups_are_capped_too() -> None:
    state, _, _ = make(max_nodes=1)
    state.ingest(push("n0", 0.9, job="1"))
    state.ingest(push("n0", 0.9, job="2"))  # groups are forgotten only at a tick
    with pytest.raises(CapacityError, match="peer groups"):
        state.ingest(push("n0", 0.9, job="3"))
    state.tick()
    state.ingest(push("n0", 0.9, job="3"))
    assert state.group_count() == 2


@pytest.mark.parametrize(
    "bad",
    [
        {"score": math.nan},
        {"score": math.inf},
        {"score": -0.01},
        {"score": 1.01},
        {"score": True},
        {"score": "0.5"},
        {"node_id": ""},
        {"cluster_id": ""},
        {"state": "busy"},
        {"rank": "3"},
    ],
)
def test_bad_pushes_raise_and_leave_the_map_intact(bad: dict[str, object]) -> None:
    state, _, _ = make()
    feed(state, healthy(5))
    good = push("n0", 0.9)
    with pytest.raises(ValueError):
        state.ingest(replace(good, **bad))  # type: ignore[arg-type]
    assert state.node_count() == 5
    result = state.tick()
    assert result.groups[0].median == 0.9 and result.groups[0].active_nodes == 5
    assert state.ingest(good).quorum_met


def test_coverage_low_is_informational() -> None:
    quorum = QuorumConfig(max_expected_nodes=10, coverage_fraction=0.8)
    state, _, _ = make(quorum=quorum)
    feed(state, healthy(7))
    result = state.tick()
    (cluster,) = result.clusters
    assert cluster.coverage_low and result.groups[0].coverage_low
    assert result.groups[0].quorum_met  # does not change the threshold's validity
    state.ingest(push("n7", 0.9))
    assert not state.tick().clusters[0].coverage_low


def test_concurrent_ingest_and_ticks_keep_a_consistent_map() -> None:
    """Pushes (with job moves and silences that expire) race ticks; the map stays whole."""
    state, clock, config = make()
    errors: list[BaseException] = []

    stop = threading.Event()

    def pusher(prefix: str) -> None:
        try:
            round_ = 0
            # At least 60 rounds, and on until the ticker has raced them a while.
            while round_ < 60 or not stop.is_set():
                round_ += 1
                for i in range(40):
                    if (i + round_) % 7 == 0:
                        continue  # some nodes fall silent now and then
                    job = str((i + round_ // 10) % 3)  # and move between jobs
                    score = 0.5 + 0.01 * ((i * 7 + round_) % 40)
                    state.ingest(push(f"{prefix}{i}", score, job=job))
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=pusher, args=(p,)) for p in "abcd"]
    for t in threads:
        t.start()
    for _ in range(20):
        state.tick()
        clock.advance(config.node_ttl / 4)
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    # After the race, one clean round must give exactly the per-job statistics.
    clock.advance(config.node_ttl)
    final: dict[str, list[float]] = {}
    for p in "abcd":
        for i in range(40):
            score = 0.6 + 0.005 * i
            job = str(i % 3)
            state.ingest(push(f"{p}{i}", score, job=job))
            final.setdefault(job, []).append(score)
    result = state.tick()
    assert state.node_count() == 160
    assert {g.job_id: g.active_nodes for g in result.groups} == {
        j: len(v) for j, v in final.items()
    }
    for group in result.groups:
        assert group.median == statistics.median(final[str(group.job_id)])


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["1", "2", "3"]), st.floats(0.0, 1.0)), min_size=1, max_size=40
    )
)
def test_group_figures_match_a_per_group_computation(pushes: list[tuple[str, float]]) -> None:
    state, _, config = make()
    members: dict[str, list[float]] = {}
    for i, (job, score) in enumerate(pushes):
        state.ingest(push(f"n{i}", score, job=job))
        members.setdefault(job, []).append(score)
    result = state.tick()
    assert {g.job_id for g in result.groups} == set(members)
    tcfg = config.threshold
    for group in result.groups:
        values = members[str(group.job_id)]
        med = statistics.median(values)
        mad = statistics.median([abs(v - med) for v in values])
        thr = max(0.0, med - max(tcfg.k * 1.4826 * mad, tcfg.min_margin))
        assert group.median == med and group.mad == mad
        assert group.threshold == pytest.approx(thr, abs=1e-12)
        assert group.quorum_met is (len(values) >= config.quorum.statistical_min)
        below = sum(v < np.float64(group.threshold) for v in values)
        assert group.below_count == below
        expected_stragglers = below if group.quorum_met else 0
        assert group.straggler_count == expected_stragglers
        assert group.panic is bool(group.quorum_met and below / len(values) > tcfg.panic_fraction)


def test_slots_grow_and_a_freed_slot_holds_nothing_of_its_last_node() -> None:
    """Past the initial 1024 slots every column grows; a node that takes an expired node's
    slot starts from nothing (no episode, ratios or straggler ticks of the slot's last)."""
    state, clock, config = make()
    many = {f"n{i}": 0.9 + (i % 7) / 1000 for i in range(1500)}
    many["n7"] = 0.1
    for cluster in ("c1", "c2"):
        for node, score in many.items():
            state.ingest(push(node, score, cluster=cluster, rates={"throughput": 5.0}))
    result = state.tick()
    assert state.node_count() == 3000
    assert {(v.cluster_id, v.node_id) for v in result.verdicts} == {("c1", "n7"), ("c2", "n7")}
    clock.advance(config.node_ttl)
    for node, score in many.items():
        state.ingest(push(node, score))  # c2 falls silent
    assert len(state.tick().expired_nodes) == 1500
    fresh = [state.ingest(push(f"new{i}", 0.9)) for i in range(1500)]  # into c2's slots
    assert state.node_count() == 3000
    assert all(v.episode_id is None and v.rate_ratios is None for v in fresh)
    result = state.tick()
    assert [(v.cluster_id, v.node_id) for v in result.verdicts] == [("c1", "n7")]
    (group,) = result.groups
    assert group.active_nodes == 3000 and group.straggler_count == 1


def test_replicas_of_an_inference_service_are_one_peer_group() -> None:
    """Without a job, the service groups replicas (two services: two groups, neither
    counted in the other's statistics); a job still comes first; the group's peer medians
    include the replicas' token speed."""
    state, _, _ = make()
    for i in range(6):
        state.ingest(
            push(
                f"a{i}",
                0.9 if i else 0.4,
                job=None,
                service="chat",
                workload_type="inference",
                rates={"inference_token_rate": 30.0 if i else 15.0},
            )
        )
        state.ingest(push(f"b{i}", 0.2, job=None, service="embed", workload_type="inference"))
    state.ingest(push("j0", 0.9, service="chat"))  # in job 42: the job's group
    result = state.tick()
    assert {e.node_id for e in of_type(result, "straggler_state")} == {"a0"}
    chat = state.threshold_view("c1", service="chat", node_id="a0")
    assert chat is not None and chat.active_nodes == 6
    assert chat.peer_rates == {"inference_token_rate": 30.0}
    assert chat.rate_ratios == {"inference_token_rate": 0.5}
    embed = state.threshold_view("c1", service="embed")
    assert embed is not None and embed.active_nodes == 6
    job = state.threshold_view("c1", JOB)
    assert job is not None and job.active_nodes == 1
    assert state.threshold_view("c1", workload_type="inference") is None


def test_a_pushed_rate_that_is_not_a_finite_number_at_least_zero_is_not_kept() -> None:
    """A negative, infinite or NaN rate counts as not pushed (no ratio, not in the peer
    median); a later push without rates forgets the node's earlier ones."""
    state, _, _ = make()
    good = {"step_rate": 2.0, "kernel_launch_rate": 100.0, "nccl_collective_rate": 3.0}
    for i in range(1, 6):
        state.ingest(push(f"n{i}", 0.9, rates=good))
    bad = {"step_rate": -1.0, "kernel_launch_rate": math.inf, "nccl_collective_rate": math.nan}
    state.ingest(push("n0", 0.9, rates=bad))
    state.tick()
    view = state.threshold_view("c1", JOB, node_id="n0")
    assert view is not None and view.peer_rates == good
    assert view.rate_ratios is None
    state.ingest(push("n1", 0.9))  # no rates any more
    view = state.threshold_view("c1", JOB, node_id="n1")
    assert view is not None and view.rate_ratios is None
