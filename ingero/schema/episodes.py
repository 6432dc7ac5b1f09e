"""Straggler episodes folded from their events: the one fold that Echo's store, ``ingero
events`` and the Slurm epilog share.

An episode of a node (within one job) opens at its first ``straggler_state``, is extended
by the re-emits, and closes at ``straggler_resolved``. Its producers (fleet-push's
classifier, Fleet's tick) give all of these one ``event_id``, so an event is identified by
(``event_id``, ``type``, ``timestamp``) (:func:`identity`), never by the id alone.

The fold takes events in any order, as Echo receives them (retries, two forwarders): a
late event of an episode already closed folds into it, found by its ``event_id``, and a
``straggler_resolved`` that comes before its episode's ``straggler_state`` makes the
episode closed, for that state to fold into. Given events in time order, as ``ingero
events`` and the epilog read them, it yields each episode once. Pure and standard library
only: the epilog imports it, and must start fast.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

STATE = "straggler_state"
RESOLVED = "straggler_resolved"
TYPES = frozenset({STATE, RESOLVED})
RECENTLY_CLOSED = 50_000  # closed episodes kept by event id, for their late events

EpisodeKey = tuple[str, str, str]  # (cluster_id, node_id, job_id or "")


def identity(event_id: str, kind: str, timestamp: object) -> tuple[str, str, object]:
    """What tells one stored event from another (Echo's unique key, and every reader's)."""
    return (event_id, kind, timestamp)


class Mark(NamedTuple):
    """One straggler event, as the fold reads it."""

    event_id: str
    type: str  # STATE or RESOLVED
    cluster_id: str
    node_id: str
    job_id: str | None
    ts: float
    score: float | None = None
    threshold: float | None = None
    signal: str | None = None


@dataclass
class Episode:
    """A straggler episode so far.

    ``min_score`` is its worst score, ``threshold`` and ``signal`` those of the event that
    had it (of its first event while no event had a score); ``max_depth`` is its largest
    ``threshold - score``. ``end_ts`` is None while it is open.
    """

    id: int
    event_id: str  # of the event that opened it
    cluster_id: str
    node_id: str
    job_id: str  # "" without a job
    start_ts: float
    last_ts: float
    max_depth: float | None = None
    min_score: float | None = None
    n_events: int = 0
    end_ts: float | None = None
    threshold: float | None = None
    signal: str | None = None

    @property
    def key(self) -> EpisodeKey:
        return (self.cluster_id, self.node_id, self.job_id)


class EpisodeFold:
    """Folds marks into episodes; hands out episode ids from ``next_id`` up.

    ``open_episodes`` and ``closed`` restore a fold (Echo's writer reloads them from its
    tables); ``closed`` oldest first, of which the newest ``keep_closed`` are kept.
    """

    def __init__(
        self,
        open_episodes: Iterable[Episode] = (),
        closed: Iterable[Episode] = (),
        next_id: int = 1,
        keep_closed: int = RECENTLY_CLOSED,
    ) -> None:
        self.next_id = next_id
        self._keep = keep_closed
        self._open: dict[EpisodeKey, Episode] = {ep.key: ep for ep in open_episodes}
        self._closed: dict[str, Episode] = {}  # by event id, oldest first
        for ep in closed:
            self._remember_closed(ep.event_id, ep)

    def add(self, mark: Mark) -> Episode:
        """Fold one event in; returns the episode it now belongs to (new or not)."""
        key = (mark.cluster_id, mark.node_id, mark.job_id or "")
        ts = mark.ts
        late = self._closed.get(mark.event_id)
        if late is not None and late.end_ts is not None and ts <= late.end_ts:
            if mark.type == RESOLVED:
                late.end_ts = max(late.end_ts, ts)
            else:
                if late.n_events == 1:  # it holds only its resolution, which came first
                    late.start_ts = late.last_ts = ts
                _widen(late, mark)
            late.n_events += 1
            return late
        ep = self._open.get(key)
        if mark.type == RESOLVED:
            if ep is None:  # it came first: its straggler_state will fold in later
                ep = self._new(mark, key)
            else:
                del self._open[key]
                if ep.event_id != mark.event_id:
                    self._remember_closed(ep.event_id, ep)
            ep.end_ts = max(ep.last_ts, ts)
            ep.n_events += 1
            self._remember_closed(mark.event_id, ep)
            return ep
        if ep is None:
            ep = self._new(mark, key)
            self._open[key] = ep
        _widen(ep, mark)
        ep.n_events += 1
        return ep

    def _new(self, mark: Mark, key: EpisodeKey) -> Episode:
        ep = Episode(self.next_id, mark.event_id, *key, start_ts=mark.ts, last_ts=mark.ts)
        self.next_id += 1
        return ep

    def _remember_closed(self, event_id: str, ep: Episode) -> None:
        closed = self._closed
        closed[event_id] = ep
        if len(closed) > self._keep:
            del closed[next(iter(closed))]  # the oldest


def _widen(ep: Episode, mark: Mark) -> None:
    """Widen an episode by one ``straggler_state``: its time span, depth and worst score."""
    first = ep.n_events == 0
    ep.start_ts = min(ep.start_ts, mark.ts)
    ep.last_ts = max(ep.last_ts, mark.ts)
    score, threshold = mark.score, mark.threshold
    if score is not None:
        if threshold is not None:
            depth = threshold - score
            if ep.max_depth is None or depth > ep.max_depth:
                ep.max_depth = depth
        if ep.min_score is None or score < ep.min_score:
            ep.min_score = score
            ep.threshold = threshold
            ep.signal = mark.signal or ep.signal
            return
    if first:
        ep.threshold, ep.signal = threshold, mark.signal
