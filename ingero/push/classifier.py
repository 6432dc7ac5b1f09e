"""Hysteresis classifier: is this node a straggler against its threshold? (pure)

Rules (documented in docs/fleet-push.md):

- only ``active`` intervals with a threshold are classified;
- an episode starts when ``score < threshold`` in ``enter_intervals`` of the last
  ``enter_window`` classified intervals, the newest among them (default 3 of 5: a noisy
  sample or two is not an episode, and noisy samples above do not restart the count of a
  node just below the threshold); leaving ``active`` empties the window, and an episode's
  intervals count towards no later one: ``straggler_state`` is emitted and
  re-emitted every ``reemit_intervals`` intervals while it lasts (journald readers and a sink
  that restarted still see it), all with the episode's one ``event_id``;
- it ends once, with ``straggler_resolved`` (same ``event_id``): ``recovered`` when
  ``score >= threshold + hysteresis`` in ``exit_intervals`` classified intervals in a row
  (default 2: one noisy interval above does not end an episode of a node still slow), at
  once when the node stops being active or its job ends (reason says so);
- with no threshold (mode ``none``) an open episode is held, neither re-emitted nor resolved;
- Fleet's panic flag travels as ``extra.panic``;
- a stalled node (its job runs, it launches nothing) is classified like any active node; its
  ``straggler_state`` carries ``reason: stall``, and if its job ends before it works again
  the episode ends with ``reason: job_ended``, never ``recovered``;
- Fleet's ``peer_lag`` in the push reply (this node's NCCL rank enters its collectives
  consistently late behind its peers) makes the interval a straggler interval whatever the
  score: the same enter rule applies, the ``straggler_state`` carries ``reason: peer_lag``,
  ``peer_lag_s`` and dominant signal ``peer_lag``, and the episode cannot recover while
  Fleet still reports the lag;
- one episode, one id: an episode that starts while Fleet already has one open for this
  node takes Fleet's id (from the push reply); the node's open id goes with every push, so
  Fleet adopts it when the node saw the episode first.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ingero.otlp.health import NodePush
from ingero.push.config import ClassifierConfig
from ingero.push.detection import Decision
from ingero.schema.events import Event, new_event_id


@dataclass(frozen=True)
class Observation:
    """One interval of one node, as the classifier sees it."""

    node_id: str
    cluster_id: str
    timestamp: float
    state: str
    score: float
    threshold: float | None
    mode: str
    panic: bool = False
    job_id: str | None = None
    rank: int | None = None
    dominant_signal: str | None = None
    stalled: bool = False
    job_ended: bool = False  # the node's job is known to have ended (processes gone)
    fleet_episode: str | None = None  # Fleet's open episode of this node, from the reply
    # Fleet's entry lag (s) of this node's NCCL rank behind its peers; None: not late.
    peer_lag: float | None = None

    @classmethod
    def of(
        cls,
        push: NodePush,
        decision: Decision,
        timestamp: float,
        *,
        job_ended: bool = False,
        fleet_episode: str | None = None,
        peer_lag: float | None = None,
    ) -> Observation:
        """The interval a push and its detection decision describe."""
        return cls(
            node_id=push.node_id,
            cluster_id=push.cluster_id,
            timestamp=timestamp,
            state=push.state,
            score=push.score,
            threshold=decision.threshold,
            mode=decision.mode,
            panic=decision.panic,
            job_id=push.job_id,
            rank=push.rank,
            dominant_signal=push.dominant_signal,
            stalled=push.stalled,
            job_ended=job_ended,
            fleet_episode=fleet_episode,
            peer_lag=peer_lag,
        )


class Classifier:
    def __init__(self, config: ClassifierConfig) -> None:
        self._config = config
        self._episode: str | None = None
        self._job: str | None = None  # the job the open episode began in
        self._stall = False  # the open episode is (or became) a stall
        # The last enter_window classified intervals, below or not, outside an episode.
        self._recent: deque[bool] = deque(maxlen=max(config.enter_window, config.enter_intervals))
        self._since_emit = 0
        self._emits = 0
        # Classified intervals in a row at threshold + hysteresis or above, in the episode.
        self._above = 0

    @property
    def straggling(self) -> bool:
        return self._episode is not None

    @property
    def episode_id(self) -> str:
        """The open episode's id, "" when none (pushed as ``ingero.episode.id``)."""
        return self._episode or ""

    def observe(self, obs: Observation) -> list[Event]:
        """Events for this interval (usually none)."""
        if self._episode is not None and self._job is not None and obs.job_id != self._job:
            # The job the episode belongs to is no longer this node's: as Fleet says it.
            self._recent.clear()
            return [self._end(obs, "job_ended" if obs.job_id is None else "group_changed")]
        if obs.state != "active":
            self._recent.clear()
            if self._episode is None:
                return []
            ended = (
                obs.job_ended or self._stall or (self._job is not None and obs.job_id != self._job)
            )
            return [self._end(obs, "job_ended" if ended else f"node is {obs.state}")]
        lagging = obs.peer_lag is not None
        if obs.threshold is None and not lagging:
            return []
        below = lagging or (obs.threshold is not None and obs.score < obs.threshold)
        if self._episode is None:
            self._recent.append(below)
            if below and sum(self._recent) >= self._config.enter_intervals:
                self._recent.clear()
                self._episode = obs.fleet_episode or new_event_id()
                self._job = obs.job_id
                self._stall = obs.stalled
                self._since_emit = 0
                self._emits = 1
                self._above = 0
                return [self._event("straggler_state", obs, {"repeat": 0})]
            return []
        self._stall = self._stall or obs.stalled
        recovering = (
            not lagging
            and obs.threshold is not None
            and obs.score >= obs.threshold + self._config.hysteresis
        )
        # An interval that is not at the recovery level starts the count again.
        self._above = self._above + 1 if recovering else 0
        if self._above >= self._config.exit_intervals:
            return [self._end(obs, "recovered")]
        self._since_emit += 1
        every = self._config.reemit_intervals
        if every and self._since_emit >= every:
            self._since_emit = 0
            self._emits += 1
            return [self._event("straggler_state", obs, {"repeat": self._emits - 1})]
        return []

    def _end(self, obs: Observation, reason: str) -> Event:
        event = self._event("straggler_resolved", obs, {"reason": reason})
        self._episode = None
        return event

    def _event(self, kind: str, obs: Observation, extra: dict[str, object]) -> Event:
        assert self._episode is not None
        signal = obs.dominant_signal
        if kind == "straggler_state" and obs.stalled:
            extra = {**extra, "reason": "stall"}
        elif kind == "straggler_state" and obs.peer_lag is not None:
            extra = {**extra, "reason": "peer_lag", "peer_lag_s": obs.peer_lag}
        if kind == "straggler_state" and obs.peer_lag is not None:
            # The cross-rank signal names the cause better than the node's own score does.
            signal = "peer_lag"
        return Event(
            type=kind,
            node_id=obs.node_id,
            cluster_id=obs.cluster_id,
            timestamp=obs.timestamp,
            event_id=self._episode,
            job_id=obs.job_id,
            rank=obs.rank,
            score=obs.score,
            threshold=obs.threshold,
            detection_mode=obs.mode,
            dominant_signal=signal,
            extra={**extra, "panic": obs.panic},
        )
