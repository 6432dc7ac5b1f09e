"""The straggler-episode fold (ingero.schema.episodes) and its three readers: Echo's store (see
tests/integration/echo/test_store.py), ``ingero events`` and the Slurm epilog.

Producers give an episode's ``straggler_state``, its re-emits and its
``straggler_resolved`` one ``event_id`` (docs/design.md), so every reader must tell two
events apart by (event_id, type, timestamp), not by the id alone.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from ingero.journal.episodes import EPISODE, group
from ingero.push.classifier import Classifier, Observation
from ingero.push.config import ClassifierConfig
from ingero.schema.episodes import EpisodeFold, Mark
from ingero.schema.events import Event
from ingero.slurm.hooks import run_epilog
from ingero.slurm.jobfile import JobInfo, write_job

T0 = 1_800_000_000.0


def classifier_episode() -> list[Event]:
    """One episode as fleet-push's classifier emits it: state, a re-emit, the resolution."""
    classifier = Classifier(
        ClassifierConfig(enter_intervals=1, exit_intervals=1, reemit_intervals=2)
    )
    scores = [0.5, 0.5, 0.5, 0.95]
    events: list[Event] = []
    for i, score in enumerate(scores):
        obs = Observation(
            node_id="n2",
            cluster_id="c",
            timestamp=T0 + 10 * i,
            state="active",
            score=score - 0.1 * (i == 1),
            threshold=0.8,
            mode="fleet",
            job_id="7",
            dominant_signal="compute",
        )
        events += classifier.observe(obs)
    return events


def test_the_classifier_shares_one_id_across_the_episode() -> None:
    events = classifier_episode()
    assert [e.type for e in events] == ["straggler_state", "straggler_state", "straggler_resolved"]
    assert len({e.event_id for e in events}) == 1


def test_ingero_events_shows_the_whole_episode() -> None:
    events = classifier_episode()
    rows = group(events + events)  # read twice (journal and event log): counted once
    assert [(r.kind, r.start, r.end, r.events) for r in rows] == [(EPISODE, T0, T0 + 30, 3)]
    assert not rows[0].ongoing and not rows[0].truncated
    assert rows[0].score == 0.5 and rows[0].threshold == 0.8 and rows[0].signal == "compute"


def test_the_epilog_summarises_the_whole_episode(tmp_path: Path) -> None:
    log = tmp_path / "events.ndjson"
    log.write_text("".join(e.to_json() + "\n" for e in classifier_episode()))
    jobs = tmp_path / "jobs"
    write_job(jobs, JobInfo("7", "c", "n2", 0, 2, started_at=T0 - 100))
    env = {
        "SLURM_JOB_ID": "7",
        "SLURMD_NODENAME": "n2",
        "INGERO_JOBS_DIR": str(jobs),
        "INGERO_EVENT_LOG": str(log),
        "INGERO_JOURNAL_SOCKET": str(tmp_path / "no-journal"),
    }
    summary = run_epilog(env, T0 + 200)
    assert summary["straggler_episodes"] == 1
    assert summary["straggler_seconds"] == 30.0
    assert summary["worst_score"] == 0.5


def marks_of(events: list[Event]) -> list[Mark]:
    return [
        Mark(
            e.event_id, e.type, e.cluster_id, e.node_id, e.job_id, e.timestamp, e.score, e.threshold
        )
        for e in events
    ]


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_any_arrival_order_folds_to_the_same_episode(order: tuple[int, ...]) -> None:
    marks = marks_of(classifier_episode())
    fold = EpisodeFold()
    touched = {fold.add(marks[i]).id for i in order}
    assert len(touched) == 1
    episode = fold.add(marks[0])  # a duplicate would be dropped before the fold: count it
    assert (episode.start_ts, episode.last_ts, episode.end_ts) == (T0, T0 + 20, T0 + 30)
    assert episode.n_events == 4 and episode.min_score == 0.5
    assert episode.max_depth == pytest.approx(0.3)


def test_a_restored_fold_folds_late_events_into_closed_episodes() -> None:
    first = marks_of(classifier_episode())
    fold = EpisodeFold()
    closed = fold.add(first[2])  # only the resolution so far
    restored = EpisodeFold(closed=[closed], next_id=fold.next_id)
    late = restored.add(first[0])
    assert late is closed and (late.start_ts, late.end_ts, late.n_events) == (T0, T0 + 30, 2)
    # a new episode of the same node afterwards is a new one
    later = restored.add(first[0]._replace(event_id="other", ts=T0 + 100))
    assert later.id == fold.next_id and later.end_ts is None
