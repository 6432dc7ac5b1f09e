"""The events Fleet's tick says about straggler episodes: pure builders, no state.

:class:`ingero.fleet.state.FleetState` decides, per tick, which node enters or leaves its
straggler state and which group starts to panic; this module says why an episode ended
(:func:`closing_reason`) and what each event carries: ``straggler_state`` when an episode
begins, ``straggler_resolved`` (same ``event_id``) when it ends, ``group_degraded`` once
per panic. Echo, ``ingero events`` and the epilog fold them back with ``ingero.schema.episodes``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ingero.fleet.model import NodeVerdict
from ingero.schema.events import Event

DETECTION_MODE = "fleet"


@dataclass
class Closing:
    """What an episode-ending event needs about a node (captured before its slot is freed)."""

    node_id: str
    cluster_id: str
    group: str
    job_id: str | None
    rank: int | None
    score: float
    event_id: str
    since: float
    dominant_signal: str | None
    threshold: float | None
    panic: bool


def closing_reason(active: bool, moved: bool, quorum: bool, job_ended: bool = False) -> str:
    """Why an episode ended this tick (expiry aside): the node's job ended (its job left
    it, or a stalled node went inactive), it went idle or stale, moved to another group,
    its group lost quorum, or it recovered. A stall never ends as ``recovered`` by
    going quiet: only a score back at its peers' level recovers."""
    if job_ended:
        return "job_ended"
    if not active:
        return "inactive"
    if moved:
        return "group_changed"
    if not quorum:
        return "quorum_lost"
    return "recovered"


def judged_in_new_group(reason: str) -> bool:
    """Whether the ending event carries the figures of the group the node is judged in now
    (else those of the group its episode belonged to)."""
    return reason in ("recovered", "quorum_lost")


def started_event(
    node: Closing | NodeVerdict,
    *,
    threshold: float | None,
    panic: bool,
    now: float,
    stall: bool = False,
    peer_lag: bool = False,
    cause_class: str | None = None,
) -> Event:
    """The ``straggler_state`` that opens the episode of ``node`` (a verdict, or one ending
    before Fleet announced it), whose fields it takes; its id is the episode's. A node
    whose job runs but which launches nothing is a straggler with ``reason: stall``; one
    whose score is not below but whose NCCL rank enters collectives late, ``reason:
    peer_lag``; ``cause_class``, what to do about it (``ingero.schema.causes``)."""
    extra: dict[str, object] = {"group": node.group, "panic": panic}
    if cause_class is not None:
        extra["cause_class"] = cause_class
    if stall:
        extra["reason"] = "stall"
    elif peer_lag:
        extra["reason"] = "peer_lag"
    return Event(
        type="straggler_state",
        node_id=node.node_id,
        cluster_id=node.cluster_id,
        timestamp=now,
        event_id=node.event_id,
        job_id=node.job_id,
        rank=node.rank,
        score=node.score,
        threshold=threshold,
        detection_mode=DETECTION_MODE,
        dominant_signal=node.dominant_signal,
        extra=extra,
    )


def resolved_event(closing: Closing, now: float, reason: str) -> Event:
    """The event that ends a straggler episode; it reuses the episode's event id."""
    return Event(
        type="straggler_resolved",
        node_id=closing.node_id,
        cluster_id=closing.cluster_id,
        timestamp=now,
        event_id=closing.event_id,
        job_id=closing.job_id,
        rank=closing.rank,
        score=closing.score,
        threshold=closing.threshold,
        detection_mode=DETECTION_MODE,
        dominant_signal=closing.dominant_signal,
        extra={
            "group": closing.group,
            "panic": closing.panic,
            "reason": reason,
            "since": closing.since,
            "duration_s": now - closing.since,
        },
    )


def degraded_event(
    *,
    cluster_id: str,
    group: str,
    job_id: str | None,
    threshold: float | None,
    below_nodes: int,
    active_nodes: int,
    median: float | None,
    now: float,
) -> Event:
    """The one ``group_degraded`` of a group whose panic began this tick."""
    return Event(
        type="group_degraded",
        node_id="",
        cluster_id=cluster_id,
        timestamp=now,
        job_id=job_id,
        threshold=threshold,
        detection_mode=DETECTION_MODE,
        extra={
            "group": group,
            "panic": True,
            "below_nodes": below_nodes,
            "active_nodes": active_nodes,
            "median": median,
        },
    )
