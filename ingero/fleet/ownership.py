"""Which clusters this Fleet replica owns for drains: pure rules on an injected time.

Replicas behind a balancer that hashes on the cluster id share nothing: each cluster's
pushes go to one replica, move to another when it dies and back when it returns. What a
replica knows of a cluster it just took over (or of one that moved away) is partial, so a
replica drains a node only while it *owns* the node's cluster (DESIGN.md "Slurm drain"):

- it received a push of that cluster within the last two push intervals (a cluster that
  moved away stops pushing here, while its nodes stay tracked until they expire), and
- the node's peer group had quorum at each of the last ``min_intervals`` ticks (the
  drain's own ``min_intervals``) since the replica took the cluster over.

A replica takes a cluster over with the first push of a cluster it has not seen, or has
not seen for longer than the node TTL (its nodes have expired, so its thresholds are
rebuilt from the next pushes; nodes are fail-open meanwhile). A tick at which the cluster
is not fresh, or the group has no quorum, starts the count again.
"""

from __future__ import annotations

from collections.abc import Iterable


def owns(
    now: float, last_push: float | None, quorum_ticks: int, push_interval: float, min_intervals: int
) -> bool:
    """The ownership rule: pushes of the cluster within two intervals, and the group's
    quorum for ``min_intervals`` ticks since the takeover."""
    return (
        last_push is not None
        and now - last_push <= 2 * push_interval
        and quorum_ticks >= min_intervals
    )


class Ownership:
    """Per cluster: the last push and the takeover; per group: ticks with quorum since.

    Memory is bounded by the tracked clusters and groups: a cluster silent for longer
    than the TTL and a group absent from a tick are forgotten.
    """

    def __init__(self, push_interval: float, ttl: float, min_intervals: int) -> None:
        self._interval = push_interval
        self._ttl = ttl
        self._min = min_intervals
        self._last: dict[str, float] = {}  # cluster -> monotonic time of its last push
        self._quorum: dict[str, dict[str, int]] = {}  # cluster -> group -> quorum ticks
        self._taken: list[str] = []  # takeovers since the last tick
        self.takeovers = 0

    def pushed(self, cluster: str, now: float) -> bool:
        """Note a push of ``cluster`` (on the ingest path: O(1)); True when it takes the
        cluster over."""
        last = self._last.get(cluster)
        self._last[cluster] = now
        if last is not None and now - last <= self._ttl:
            return False
        self._quorum.pop(cluster, None)
        self._taken.append(cluster)
        self.takeovers += 1
        return True

    def tick(self, now: float, groups: Iterable[tuple[str, str, bool]]) -> list[str]:
        """One tick's groups as (cluster, group key, quorum met); returns the clusters
        taken over since the previous tick."""
        counts: dict[str, dict[str, int]] = {}
        for cluster, group, quorum in groups:
            last = self._last.get(cluster)
            fresh = last is not None and now - last <= 2 * self._interval
            before = self._quorum.get(cluster, {}).get(group, 0)
            counts.setdefault(cluster, {})[group] = before + 1 if quorum and fresh else 0
        self._quorum = counts
        for cluster in [c for c, t in self._last.items() if now - t > self._ttl]:
            del self._last[cluster]
        taken, self._taken = self._taken, []
        return list(dict.fromkeys(taken))

    def owner(self, cluster: str, group: str, now: float) -> bool:
        """Whether this replica may drain a node of ``group`` in ``cluster`` now."""
        ticks = self._quorum.get(cluster, {}).get(group, 0)
        return owns(now, self._last.get(cluster), ticks, self._interval, self._min)

    def owned(self, now: float) -> int:
        """How many clusters pushed here within two intervals (for /metrics)."""
        return sum(1 for t in self._last.values() if now - t <= 2 * self._interval)
