"""Plain values passed between Fleet's receivers (I/O) and its pure state (core)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

NodeState = Literal["calibrating", "active", "idle", "stale"]
NODE_STATES: frozenset[str] = frozenset({"calibrating", "active", "idle", "stale"})


def group_key(cluster_id: str, job_id: str | None, workload_type: str | None) -> str:
    """The peer group a node is compared within: its Slurm job, else cluster + workload."""
    if job_id:
        return f"{cluster_id}/job/{job_id}"
    return f"{cluster_id}/workload/{workload_type or 'unknown'}"


@dataclass(frozen=True)
class NodePush:
    """One validated health push of one node (decoded from OTLP by a receiver)."""

    node_id: str
    cluster_id: str
    score: float
    state: NodeState = "active"
    host_name: str | None = None
    job_id: str | None = None
    rank: int | None = None
    world_size: int | None = None
    workload_type: str | None = None
    dominant_signal: str | None = None
    signals: dict[str, float] = field(default_factory=dict)
    rates: dict[str, float] = field(default_factory=dict)
    gpu_model: str | None = None
    gpu_count: int | None = None
    provider: str | None = None

    @property
    def group(self) -> str:
        return group_key(self.cluster_id, self.job_id, self.workload_type)


@dataclass(frozen=True)
class ThresholdView:
    """A peer group's current threshold, as returned in push responses and the API."""

    cluster_id: str
    group: str
    threshold: float | None
    median: float | None
    mad: float | None
    quorum_met: bool
    panic: bool
    active_nodes: int
    computed_at: float | None

    def to_json(self) -> dict[str, object]:
        return {
            "cluster_id": self.cluster_id,
            "group": self.group,
            "threshold": self.threshold,
            "median": self.median,
            "mad": self.mad,
            "quorum_met": self.quorum_met,
            "panic": self.panic,
            "active_nodes": self.active_nodes,
            "computed_at": self.computed_at,
        }
