"""What Fleet tells one node in its push reply: its group's threshold view plus the node's
own fields (rate ratios, open episode, NCCL lag, the episode naming its rank, whom it waits for).

Their own room: pure functions of a view and the node's figures, called by
:class:`ingero.fleet.state.FleetState` after it released its lock.
"""

from __future__ import annotations

from collections.abc import Mapping

from ingero.fleet.communicator import NcclNamed
from ingero.otlp.threshold import ThresholdView, with_fields


def node_view(
    view: ThresholdView,
    rates: Mapping[str, float],
    episode: str,
    lag: float | None = None,
    named: NcclNamed | None = None,
    waiting: dict[str, object] | None = None,
) -> ThresholdView:
    """The group's view plus what is the node's own: its ratio to each peer median (from
    its pushed rates), Fleet's open episode of it, its flagged NCCL entry lag (s), the
    open NCCL episode that names one of its ranks, and whom its rank waits for."""
    peers = view.peer_rates
    ratios = None
    if peers:
        ratios = {}
        for name, median in peers.items():
            rate = rates.get(name)
            if rate is not None and rate == rate and median > 0:  # rate == rate: not NaN
                ratios[name] = rate / median
    if not ratios and not episode and lag is None and named is None and waiting is None:
        return view
    return with_fields(
        view,
        rate_ratios=ratios or None,
        episode_id=episode or None,
        peer_lag=lag,
        nccl_episode_id=named.event_id if named else None,
        nccl_episode_type=named.type if named else None,
        nccl_episode_since=named.since if named else None,
        nccl_episode_op=named.op if named else None,
        nccl_episode_seq=named.seq if named else None,
        waiting_for=waiting,
    )


_EMPTY_VIEW = ThresholdView(active_nodes=0)  # no threshold, median, quorum, panic, tick


def empty_view(cluster_id: str, group: str) -> ThresholdView:
    """A group no tick has seen yet: no threshold, no quorum. Every push of a new group
    until the next tick gets one: a copy of a template, not a dataclass __init__."""
    return with_fields(_EMPTY_VIEW, cluster_id=cluster_id, group=group)
