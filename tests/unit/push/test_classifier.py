"""Hysteresis classifier: edges, one event_id per episode, re-emits, panic, non-active nodes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ingero.otlp.threshold import ENTER_INTERVALS, ENTER_WINDOW, EXIT_INTERVALS
from ingero.push.classifier import Classifier, Observation
from ingero.push.config import ClassifierConfig
from tests.unit.enter_rule import ENTER_WINDOW as ENTER_RULES
from tests.unit.exit_rule import EXIT_RULES

BASE = Observation(
    node_id="n1",
    cluster_id="c",
    timestamp=1.0,
    state="active",
    score=0.9,
    threshold=0.7,
    mode="fleet",
    job_id="42",
    rank=3,
    dominant_signal="throughput",
)


def run(c: Classifier, *scores: float, **kw: object) -> list[list[str]]:
    return [[e.type for e in c.observe(replace(BASE, score=s, **kw))] for s in scores]  # type: ignore[arg-type]


def test_enters_strictly_below_and_resolves_at_threshold_plus_hysteresis() -> None:
    c = Classifier(
        ClassifierConfig(hysteresis=0.02, reemit_intervals=0, enter_intervals=1, exit_intervals=1)
    )
    assert run(c, 0.7) == [[]]  # equal is not below
    assert run(c, 0.6999) == [["straggler_state"]]
    assert run(c, 0.71, 0.7199) == [[], []]  # inside the hysteresis band: still a straggler
    assert run(c, 0.72) == [["straggler_resolved"]]
    assert run(c, 0.72, 0.9) == [[], []]


def test_one_event_id_per_episode_and_fields() -> None:
    c = Classifier(ClassifierConfig(reemit_intervals=2, enter_intervals=1, exit_intervals=1))
    events = [e for s in (0.5, 0.5, 0.5, 0.5, 0.5, 0.9) for e in c.observe(replace(BASE, score=s))]
    assert [e.type for e in events] == [
        "straggler_state",
        "straggler_state",
        "straggler_state",
        "straggler_resolved",
    ]
    assert len({e.event_id for e in events}) == 1
    assert [e.extra.get("repeat") for e in events[:3]] == [0, 1, 2]
    first = events[0]
    assert (first.job_id, first.rank, first.detection_mode, first.dominant_signal) == (
        "42",
        3,
        "fleet",
        "throughput",
    )
    assert first.score == 0.5 and first.threshold == 0.7
    nxt = c.observe(replace(BASE, score=0.1))
    assert nxt[0].event_id != first.event_id


def test_panic_is_carried() -> None:
    c = Classifier(ClassifierConfig(enter_intervals=1))
    (event,) = c.observe(replace(BASE, score=0.1, panic=True))
    assert event.extra["panic"] is True
    assert event.to_dict()["panic"] is True


def test_only_active_nodes_are_classified_and_leaving_active_resolves() -> None:
    c = Classifier(ClassifierConfig(enter_intervals=1))
    assert run(c, 0.1, state="calibrating") == [[]]
    assert run(c, 0.1, state="idle") == [[]]
    assert run(c, 0.1) == [["straggler_state"]]
    (event,) = c.observe(replace(BASE, score=0.1, state="idle"))
    assert event.type == "straggler_resolved" and event.extra["reason"] == "node is idle"
    assert not c.straggling


def test_no_threshold_holds_the_episode() -> None:
    c = Classifier(ClassifierConfig(reemit_intervals=1, enter_intervals=1))
    run(c, 0.1)
    assert run(c, 0.9) == [["straggler_state"]]  # a re-emit, one towards the exit (of 2) ...
    assert run(c, 0.1, 0.9, threshold=None, mode="none") == [[], []]
    assert c.straggling
    assert run(c, 0.9) == [["straggler_resolved"]]  # ... held over them: this is the second


def test_entry_needs_consecutive_intervals_below() -> None:
    # A window no longer than the count: in a row.
    c = Classifier(ClassifierConfig(enter_intervals=3, enter_window=3))
    assert run(c, 0.5, 0.5, 0.9, 0.5, 0.5) == [[], [], [], [], []]  # interrupted: count restarts
    assert run(c, 0.5) == [["straggler_state"]]
    c = Classifier(ClassifierConfig(enter_intervals=2, enter_window=2))
    run(c, 0.5)
    assert run(c, 0.5, state="idle") == [[]]  # leaving active resets the count
    assert run(c, 0.5) == [[]]
    assert run(c, 0.5) == [["straggler_state"]]


@pytest.mark.parametrize(("count", "window", "scores", "enters"), ENTER_RULES)
def test_entry_needs_enter_intervals_below_within_the_enter_window(
    count: int, window: int, scores: list[float], enters: int | None
) -> None:
    c = Classifier(ClassifierConfig(enter_intervals=count, enter_window=window))
    got = run(c, *scores)
    assert got == [["straggler_state"] if i == enters else [] for i in range(len(scores))]


def test_an_episode_and_leaving_active_start_the_enter_window_afresh() -> None:
    c = Classifier(
        ClassifierConfig(enter_intervals=2, enter_window=3, reemit_intervals=0, exit_intervals=1)
    )
    first = run(c, 0.5, 0.5, 0.5, 0.9, 0.5)
    # The episode's intervals below count towards no later episode.
    assert first == [[], ["straggler_state"], [], ["straggler_resolved"], []]
    assert run(c, 0.5) == [["straggler_state"]]  # two below since the episode ended
    assert run(c, 0.9, 0.5) == [["straggler_resolved"], []]
    assert run(c, 0.5, state="idle") == [[]]  # leaving active empties the window
    assert run(c, 0.5, 0.5) == [[], ["straggler_state"]]


def test_an_episode_takes_fleets_open_id_else_a_new_one() -> None:
    c = Classifier(ClassifierConfig(enter_intervals=2, exit_intervals=1))
    assert c.episode_id == ""
    c.observe(replace(BASE, score=0.5))
    (event,) = c.observe(replace(BASE, score=0.5, fleet_episode="fleet-1"))
    assert event.event_id == "fleet-1" and c.episode_id == "fleet-1"
    (end,) = c.observe(replace(BASE, score=0.9))
    assert end.event_id == "fleet-1" and c.episode_id == ""
    c.observe(replace(BASE, score=0.5))
    (own,) = c.observe(replace(BASE, score=0.5))
    assert own.event_id not in ("", "fleet-1") and c.episode_id == own.event_id


def test_a_stall_is_flagged_with_reason_stall_and_ends_with_its_job() -> None:
    c = Classifier(ClassifierConfig(enter_intervals=1, reemit_intervals=1))
    (state,) = c.observe(replace(BASE, score=0.1, stalled=True))
    assert state.type == "straggler_state" and state.extra["reason"] == "stall"
    (again,) = c.observe(replace(BASE, score=0.1, stalled=True))
    assert again.extra["reason"] == "stall" and again.extra["repeat"] == 1
    # Quiet and its job's processes gone: idle, and the episode ends with its job.
    (end,) = c.observe(replace(BASE, state="idle", score=0.9, job_ended=True))
    assert end.type == "straggler_resolved" and end.extra["reason"] == "job_ended"
    # A stall ends as job_ended even when nothing said the job ended: it went quiet.
    c.observe(replace(BASE, score=0.1, stalled=True))
    (end,) = c.observe(replace(BASE, state="idle", score=0.9))
    assert end.extra["reason"] == "job_ended"


def test_the_job_leaving_the_node_ends_its_episode_as_fleet_says() -> None:
    c = Classifier(ClassifierConfig(enter_intervals=1))
    c.observe(replace(BASE, score=0.5))
    (end,) = c.observe(replace(BASE, score=0.5, job_id=None))
    assert end.extra["reason"] == "job_ended" and end.job_id is None
    c.observe(replace(BASE, score=0.5))
    (moved,) = c.observe(replace(BASE, score=0.5, job_id="43"))
    assert moved.extra["reason"] == "group_changed"
    # An idle node with no reason to think its job ended says so plainly, as before.
    c.observe(replace(BASE, score=0.5))
    (idle,) = c.observe(replace(BASE, state="idle", score=0.9))
    assert idle.extra["reason"] == "node is idle"


# The default enter rule: an episode starts at the N-th interval below (in a row here).
N = ENTER_INTERVALS
BEFORE: list[list[str]] = [[]] * (N - 1)  # the intervals below before the episode starts
# ... and the default exit rule: it ends at the M-th interval at the recovery level in a row.
M = EXIT_INTERVALS
UNTIL_END: list[list[str]] = [[]] * (M - 1)  # those intervals before it ends
# (name, [(score, peer_lag)] per interval, events per interval)
PEER_LAG = [
    (
        "lag above the threshold enters after ENTER_INTERVALS",
        [(0.9, 0.29)] * N + [(0.9, 0.3)],
        [*BEFORE, ["straggler_state"], []],
    ),
    (
        "lagging intervals farther apart than the enter window are no episode",
        ([(0.9, 0.29)] + [(0.9, None)] * (ENTER_WINDOW - 1)) * N,
        [[]] * (ENTER_WINDOW * N),
    ),
    (
        "a good score does not recover while Fleet reports the lag",
        [(0.9, 0.2)] * N + [(0.95, 0.2)] + [(0.95, None)] * M,
        [*BEFORE, ["straggler_state"], [], *UNTIL_END, ["straggler_resolved"]],
    ),
    (
        "a lagging interval starts the exit count again",
        [(0.9, 0.2)] * N + [(0.95, None)] * (M - 1) + [(0.95, 0.2)] + [(0.95, None)] * M,
        [*BEFORE, ["straggler_state"], *UNTIL_END, [], *UNTIL_END, ["straggler_resolved"]],
    ),
    (
        "low score then lag count as one run",
        [(0.5, None)] * (N - 1) + [(0.9, 0.2)],
        [*BEFORE, ["straggler_state"]],
    ),
    (
        "lag gone, low score keeps the episode",
        [(0.9, 0.2)] * N + [(0.5, None)] + [(0.9, None)] * M,
        [*BEFORE, ["straggler_state"], [], *UNTIL_END, ["straggler_resolved"]],
    ),
]


@pytest.mark.parametrize(("name", "steps", "expected"), PEER_LAG, ids=[p[0] for p in PEER_LAG])
def test_fleets_peer_lag_makes_a_straggler_interval_whatever_the_score(
    name: str, steps: list[tuple[float, float | None]], expected: list[list[str]]
) -> None:
    c = Classifier(ClassifierConfig(reemit_intervals=0))  # the default enter rule
    got = [[e.type for e in c.observe(replace(BASE, score=s, peer_lag=lag))] for s, lag in steps]
    assert got == expected


def test_a_peer_lag_episode_names_the_signal_and_the_lag() -> None:
    c = Classifier(ClassifierConfig(reemit_intervals=0))
    events = [e for _ in range(N) for e in c.observe(replace(BASE, peer_lag=0.29))]
    (event,) = events
    assert event.dominant_signal == "peer_lag"
    assert event.extra["reason"] == "peer_lag" and event.extra["peer_lag_s"] == 0.29
    assert event.score == 0.9 and event.threshold == 0.7


def test_peer_lag_classifies_without_a_threshold_too() -> None:
    # No quorum for the score, but Fleet joined the ranks: the lag alone is a signal.
    c = Classifier(ClassifierConfig(reemit_intervals=0))
    got = run(c, *[0.9] * N, threshold=None, peer_lag=0.2)
    assert got == [*BEFORE, ["straggler_state"]]
    # ... and with neither, the episode is held (nothing says it recovered).
    assert run(c, 0.9, threshold=None) == [[]]
    assert c.straggling


# The letters of tests/unit/exit_rule.py against a threshold of 0.7, hysteresis 0.02.
LEVEL = {"b": 0.5, "h": 0.71, "u": 0.72}


@pytest.mark.parametrize(("count", "steps", "ends"), EXIT_RULES)
def test_an_episode_ends_after_exit_intervals_in_a_row_at_the_recovery_level(
    count: int, steps: str, ends: int | None
) -> None:
    c = Classifier(
        ClassifierConfig(
            hysteresis=0.02, enter_intervals=1, exit_intervals=count, reemit_intervals=0
        )
    )
    assert run(c, 0.5) == [["straggler_state"]]
    got = run(c, *(LEVEL[step] for step in steps))
    assert got == [["straggler_resolved"] if i == ends else [] for i in range(len(steps))]
    assert c.straggling is (ends is None)


def test_the_default_exit_rule_outlasts_one_noisy_interval() -> None:
    """A node just below its threshold with one interval above: the same episode goes on."""
    c = Classifier(ClassifierConfig(reemit_intervals=0, enter_intervals=1))
    (start,) = c.observe(replace(BASE, score=0.69))
    assert run(c, 0.9, 0.69, 0.69) == [[], [], []]
    assert c.episode_id == start.event_id
    assert run(c, *[0.9] * EXIT_INTERVALS)[-1] == ["straggler_resolved"]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"job_id": None}, "job_ended"),
        ({"job_id": "43"}, "group_changed"),
        ({"state": "idle"}, "node is idle"),
        ({"state": "idle", "job_ended": True}, "job_ended"),
        ({"state": "stale"}, "node is stale"),
    ],
)
def test_ends_that_are_not_measurements_are_immediate(
    change: dict[str, object], reason: str
) -> None:
    """Whatever the exit count: the job ended, the node is not active."""
    c = Classifier(ClassifierConfig(reemit_intervals=0, enter_intervals=1, exit_intervals=3))
    run(c, 0.5)
    assert run(c, 0.9) == [[]]  # one interval of three towards recovery
    (end,) = c.observe(replace(BASE, score=0.9, **change))  # type: ignore[arg-type]
    assert end.type == "straggler_resolved" and end.extra["reason"] == reason
