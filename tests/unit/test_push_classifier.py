"""Hysteresis classifier: edges, one event_id per episode, re-emits, panic, non-active nodes."""

from __future__ import annotations

from dataclasses import replace

from ingero.push.classifier import Classifier, Observation
from ingero.push.config import ClassifierConfig

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
    c = Classifier(ClassifierConfig(hysteresis=0.02, reemit_intervals=0, enter_intervals=1))
    assert run(c, 0.7) == [[]]  # equal is not below
    assert run(c, 0.6999) == [["straggler_state"]]
    assert run(c, 0.71, 0.7199) == [[], []]  # inside the hysteresis band: still a straggler
    assert run(c, 0.72) == [["straggler_resolved"]]
    assert run(c, 0.72, 0.9) == [[], []]


def test_one_event_id_per_episode_and_fields() -> None:
    c = Classifier(ClassifierConfig(reemit_intervals=2, enter_intervals=1))
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
    assert run(c, 0.1, 0.9, threshold=None, mode="none") == [[], []]
    assert c.straggling
    assert run(c, 0.9) == [["straggler_resolved"]]


def test_entry_needs_consecutive_intervals_below() -> None:
    c = Classifier(ClassifierConfig(enter_intervals=3))
    assert run(c, 0.5, 0.5, 0.9, 0.5, 0.5) == [[], [], [], [], []]  # interrupted: count restarts
    assert run(c, 0.5) == [["straggler_state"]]
    c = Classifier(ClassifierConfig(enter_intervals=2))
    run(c, 0.5)
    assert run(c, 0.5, state="idle") == [[]]  # leaving active resets the count
    assert run(c, 0.5) == [[]]
    assert run(c, 0.5) == [["straggler_state"]]


def test_an_episode_takes_fleets_open_id_else_a_new_one() -> None:
    c = Classifier(ClassifierConfig(enter_intervals=2))
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
