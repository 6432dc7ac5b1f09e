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
