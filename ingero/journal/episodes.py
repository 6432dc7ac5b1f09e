"""Group ingero events into what a person asks about: straggler episodes, drains, resumes.

A straggler episode on a node (per job) opens at its first ``straggler_state`` event and
closes at the next ``straggler_resolved``; repeated state events extend it (the fold of
``ingero.schema.episodes``, which Echo and the Slurm epilog share). Drains and resumes are single
rows. Pure: takes events, returns rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ingero.schema.episodes import RESOLVED, STATE, EpisodeFold, Mark, identity
from ingero.schema.events import Event

EPISODE, DRAIN, RESUME, SKIP, DEGRADED = "straggler", "drain", "resume", "skip", "degraded"

# Events shown as one row each, by type: Fleet's drain decisions and its group panics.
_SINGLE = {
    "node_drained": DRAIN,
    "node_resumed": RESUME,
    "drain_skipped": SKIP,
    "group_degraded": DEGRADED,
}
# the event types this view reads; the others (peer_lag, job_summary, ...) are left out
EVENT_TYPES = (STATE, RESOLVED, *_SINGLE)


@dataclass
class Row:
    """One line of ``ingero events``."""

    kind: str
    node_id: str
    cluster_id: str
    job_id: str | None
    start: float
    end: float | None = None
    score: float | None = None
    threshold: float | None = None
    signal: str | None = None
    events: int = 1
    panic: bool = False
    reason: str | None = None
    # a resolution whose episode began before the window that was read
    truncated: bool = False
    event_ids: list[str] = field(default_factory=list)

    @property
    def ongoing(self) -> bool:
        return self.kind == EPISODE and self.end is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "node_id": self.node_id,
            "cluster_id": self.cluster_id,
            "job_id": self.job_id,
            "start": self.start,
            "end": self.end,
            "duration": None if self.end is None else self.end - self.start,
            "ongoing": self.ongoing,
            "score": self.score,
            "threshold": self.threshold,
            "signal": self.signal,
            "events": self.events,
            "panic": self.panic,
            "reason": self.reason,
            "truncated": self.truncated,
            "event_ids": list(self.event_ids),
        }


def _single(kind: str, event: Event) -> Row:
    reason = event.extra.get("reason")
    if event.type == "group_degraded" and reason is None:
        extra = event.extra
        reason = (
            f"group {extra.get('group', '?')}: {extra.get('below_nodes', '?')} of"
            f" {extra.get('active_nodes', '?')} nodes below the threshold"
        )
    return Row(
        kind=kind,
        node_id=event.node_id,
        cluster_id=event.cluster_id,
        job_id=event.job_id,
        start=event.timestamp,
        end=event.timestamp,
        score=event.score,
        threshold=event.threshold,
        signal=event.dominant_signal,
        panic=event.extra.get("panic") is True,
        reason=str(reason) if reason is not None else None,
        event_ids=[event.event_id],
    )


def group(events: Iterable[Event]) -> list[Row]:
    """Rows ordered by start time; each event counted once (by its identity: an episode's
    events share one ``event_id``)."""
    seen: set[tuple[str, str, object]] = set()
    ordered = []
    for event in events:
        key = identity(event.event_id, event.type, event.timestamp)
        if key in seen or event.type not in EVENT_TYPES:
            continue
        seen.add(key)
        ordered.append(event)
    ordered.sort(key=lambda e: e.timestamp)

    rows: list[Row] = []
    fold = EpisodeFold()
    row_of: dict[int, Row] = {}  # episode id -> its row
    for event in ordered:
        if event.type in _SINGLE:
            rows.append(_single(_SINGLE[event.type], event))
            continue
        episode = fold.add(
            Mark(
                event.event_id,
                event.type,
                event.cluster_id,
                event.node_id,
                event.job_id,
                event.timestamp,
                event.score,
                event.threshold,
                event.dominant_signal,
            )
        )
        row = row_of.get(episode.id)
        if row is None:
            row = row_of[episode.id] = _single(EPISODE, event)
            rows.append(row)
            if event.type == RESOLVED:  # the episode began before the window that was read
                row.score = None
                row.truncated = True
            else:
                row.end = None
            continue
        row.events += 1
        row.event_ids.append(event.event_id)
        if event.type == STATE:
            row.panic = row.panic or event.extra.get("panic") is True
            # the worst score of the episode is what a person wants to see
            row.score, row.threshold = episode.min_score, episode.threshold
            row.signal = episode.signal
        else:
            row.end = episode.end_ts
    rows.sort(key=lambda r: r.start)
    return rows
