"""A rank that waits is not a straggler: what fleet-push knows of its NCCL ranks' waits.

In a lock-step job every rank stops when one does: the others enter the collective the
missing rank never reaches, return at enqueue (as real NCCL does) and wait on the GPU in
a stream sync or a launch into the full queue. On its own node each of them looks
stalled (no kernel launch while the job runs); only the ranks compared tell the victims
from the cause, and Fleet compares them (``collective_wait``,
docs/fleet-threshold.md). So a quiet node with an NCCL rank that has peers holds its
measurement, neither stalled nor counted towards a stall, until Fleet's reply says:

- its rank waits for others (``waiting_for``): it is waiting, not stalled, while that
  lasts, whatever its quiet; with no rank named, every rank of the communicator stopped at
  one collective (the job is stuck there, not a node);
- others wait for its rank (the reply's NCCL episode, ``collective_wait`` or
  ``collective_hang``): its quiet is a stall at once;
- nothing, for ``score.collective_wait_samples`` quiet samples (an older Fleet, none
  reachable, a communicator Fleet does not join): its quiet counts as before.

Lock-step ranks also share one rate: every rank makes the same steps a second, so a peer
ratio of launch rates says nothing about which rank holds the job back, and any lag in
time between a node's rate and its peers' median (the median is a tick older) makes every
rank look slow when the whole job slows. A node whose communicator has ranks on other
nodes is therefore judged by its arrivals (Fleet's ``peer_lag``), its GPU's health and its
stalls; its throughput signal is left out, but for a stall's 0 (:func:`lockstep`).

Pure: plain values in, plain values out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ingero.otlp.collectives import CommReport
from ingero.otlp.threshold import ThresholdView

# The NCCL episodes whose naming of a node's rank says the others wait for it.
WAITED_FOR_TYPES = frozenset({"collective_wait", "collective_hang"})


@dataclass(frozen=True)
class FleetNccl:
    """What Fleet's last fresh reply said of this node's NCCL ranks."""

    waiting_for: Mapping[str, Any] | None = None  # its rank waits (ingero.otlp.threshold)
    waited_for: bool = False  # others wait for its rank

    @classmethod
    def of(cls, reading: ThresholdView | None) -> FleetNccl | None:
        if reading is None:
            return None
        return cls(
            waiting_for=reading.waiting_for,
            waited_for=reading.nccl_episode_type in WAITED_FOR_TYPES
            and bool(reading.nccl_episode_id),
        )


def with_peers(comms: Iterable[CommReport]) -> bool:
    """Whether a rank of this node is in a communicator with other ranks: its quiet may be
    a wait at a collective, which only Fleet can tell from a stall."""
    return any(c.nranks > 1 for c in comms)


def lockstep(comms: Iterable[CommReport]) -> bool:
    """Whether the node's ranks are in lock-step with ranks on other nodes: a communicator
    with more ranks than the node holds of it (its peers' steps pace its own)."""
    held: dict[str, int] = {}
    size: dict[str, int] = {}
    for c in comms:
        held[c.comm_hash] = held.get(c.comm_hash, 0) + 1
        size[c.comm_hash] = c.nranks
    return any(size[h] > n for h, n in held.items())


def waiting_words(waiting_for: Mapping[str, Any]) -> str:
    """``for rank 5 (gpu07) in ncclAllReduce #8813``, or, with no rank named, ``with every
    rank in ncclAllReduce #8813``: the status line's and the log's words."""
    where = f"in {waiting_for.get('op')} #{waiting_for.get('seq')}"
    ranks = list(waiting_for.get("ranks") or ())
    nodes = list(waiting_for.get("nodes") or ())
    if not ranks:
        return f"with every rank {where}"
    shown = ", ".join(str(r) for r in ranks[:4]) + (" …" if len(ranks) > 4 else "")
    on = f" ({', '.join(nodes[:4])}{' …' if len(nodes) > 4 else ''})" if nodes else ""
    return f"for rank{'s' if len(ranks) > 1 else ''} {shown}{on} {where}"
