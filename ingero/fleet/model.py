"""Plain values passed between Fleet's receivers (I/O) and its pure state (core).

The health push (``NodePush``, ``NodeState``, the peer group key) and the threshold reply
(``ThresholdView``) are contracts between processes: they live in :mod:`ingero.otlp.health`
and :mod:`ingero.otlp.threshold`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ingero.runtime.errors import EXIT_UNAVAILABLE, IngeroError
from ingero.schema.events import Event

# A node as Fleet tracks it: node ids are unique only within a cluster (every Slurm site
# may name a node gpu01), so every per-node structure is keyed by both.
NodeKey = tuple[str, str]  # (cluster_id, node_id)


class CapacityError(IngeroError):
    """A push from a new node was refused because Fleet already tracks ``limits.max_nodes``."""

    exit_code = EXIT_UNAVAILABLE


@dataclass(frozen=True)
class GroupStats:
    """One peer group after a tick (for /metrics, the API and the drain controller).

    ``threshold`` is the EMA-smoothed threshold while the group has quorum; without quorum
    it is the raw threshold, shown for metrics only (``quorum_met`` is false and the
    ThresholdView served to nodes carries no threshold). All figures are None when the
    group has no active node.
    """

    cluster_id: str
    group: str
    job_id: str | None
    workload_type: str | None
    threshold: float | None
    raw_threshold: float | None
    median: float | None
    mad: float | None
    quorum_met: bool
    panic: bool
    active_nodes: int
    idle_nodes: int
    straggler_count: int
    coverage_low: bool
    computed_at: float
    below_count: int = 0
    tracked_nodes: int = 0
    # The median over the active nodes of how much each one's score changes from one
    # measurement to the next (None until one changed): noise_k times it is a floor of
    # the margin (ingero.fleet.threshold.group_noise).
    noise: float | None = None


@dataclass(frozen=True)
class ClusterStats:
    """Node counts of one cluster after a tick; ``coverage_low`` is informational only."""

    cluster_id: str
    active_nodes: int
    idle_nodes: int
    tracked_nodes: int
    groups: int
    coverage_low: bool
    computed_at: float


@dataclass(frozen=True)
class NodeReport:
    """What a node's last push said, for the drain controller's idle resumes: its state
    (calibrating|active|idle|stale) and its cause class (None: its agent says none)."""

    state: str
    cause_class: str | None


@dataclass(frozen=True)
class PeerLagCause:
    """The NCCL rank that made a node a straggler by peer lag alone: its communicator, its
    rank in it and how late it enters collectives (median lag behind the median entry, s)."""

    comm_hash: str
    comm_rank: int
    lag_s: float


@dataclass(frozen=True)
class NodeVerdict:
    """A node in the straggler state after a tick.

    ``consecutive_straggler_ticks`` counts ticks in a row with this verdict (the drain
    controller needs ``drain.min_intervals`` of them); ``since`` is the wall time of the
    tick the episode began; ``panic`` means the node's group is degraded as a whole and
    nothing may be drained. ``reason`` says why it is a straggler this tick: ``score`` (its
    score is below the threshold) or ``peer_lag`` (only an NCCL rank of it enters
    collectives late; ``peer_lag`` then names that rank), as the ``straggler_state`` event.
    """

    node_id: str
    cluster_id: str
    group: str
    job_id: str | None
    rank: int | None
    score: float
    threshold: float
    straggler: bool
    consecutive_straggler_ticks: int
    since: float
    panic: bool
    quorum_met: bool
    dominant_signal: str | None
    event_id: str = ""
    # This replica owns the node's cluster for drains (ingero.fleet.ownership): fresh
    # pushes of the cluster and the group's quorum for drain.min_intervals ticks since
    # the replica took the cluster over.
    drain_owner: bool = True
    reason: str = "score"
    peer_lag: PeerLagCause | None = None
    # The remediation class of the node's slowness (ingero.schema.causes): the one its
    # agent pushes, else what its dominant signal tells, else "unknown".
    cause_class: str = "unknown"


@dataclass(frozen=True)
class TickResult:
    """Everything one tick decided: group figures, straggler verdicts and new events.

    ``verdicts`` lists only the nodes in the straggler state (panicking groups included,
    marked ``panic``); every other active node is, by omission, not a straggler.
    """

    computed_at: float
    groups: tuple[GroupStats, ...]
    verdicts: tuple[NodeVerdict, ...]
    events: tuple[Event, ...]
    expired_nodes: tuple[NodeKey, ...]  # (cluster_id, node_id) of the nodes the TTL passed
    clusters: tuple[ClusterStats, ...] = ()
    # NCCL communicators joined: tracked, hung in a collective, refused by a cap.
    nccl_comms: int = 0
    hung_comms: int = 0
    nccl_refused: int = 0
    # Communicators stopped at a collective (open collective_wait episodes), and the nodes
    # whose ranks wait in one (not stragglers: the ones they wait for are named).
    waiting_comms: int = 0
    waiting_nodes: int = 0
    # Clusters this replica took over since the previous tick (first push, or first
    # after longer than the node TTL), and how many it owns now.
    taken_over: tuple[str, ...] = ()
    owned_clusters: int = 0
