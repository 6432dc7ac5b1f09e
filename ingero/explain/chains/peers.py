"""NCCL peer lag: the rank that reaches a communicator's collectives last."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Final

from ingero.explain.analysis import fmt_ns
from ingero.explain.chains.signal import Signal, in_recent, process_name
from ingero.explain.chains.timeline import CollectiveCall, RankKey, Timeline, join_collectives

# A rank that reaches this share of a communicator's aligned collectives last lags.
PEER_LAST_SHARE: Final = 0.6
PEER_MIN_LAG_NS: Final = 1_000_000
PEER_MIN_ROUNDS: Final = 5


def peer_lag_signal(t: Timeline) -> Signal | None:
    """The rank that reaches a communicator's collectives last, most of the time.

    Collectives are joined across ranks by ``join_collectives`` (their sequence number
    where the tracer numbered them). A round is a collective every rank seen (per
    communicator and op) has a sampled call in. A rank's arrival is when its call began;
    the others wait for the last one to arrive.
    """
    calls = [c for c in t.collectives if in_recent(c.ts, t)]
    groups: dict[tuple[str, str], dict[int, dict[RankKey, CollectiveCall]]] = defaultdict(dict)
    for (comm, op, n), members in join_collectives(calls).items():
        groups[(comm, op)][n] = members
    worst: tuple[float, Signal] | None = None
    for (comm, op), collectives in groups.items():
        everyone = {k for members in collectives.values() for k in members}
        if len(everyone) < 2:
            continue
        full = [m for _, m in sorted(collectives.items()) if len(m) == len(everyone)]
        rounds = len(full)
        if rounds < PEER_MIN_ROUNDS:
            continue
        ranks: dict[RankKey, list[CollectiveCall]] = defaultdict(list)
        last: dict[RankKey, int] = defaultdict(int)
        lags: dict[RankKey, list[float]] = defaultdict(list)
        for members in full:
            for k, c in members.items():
                ranks[k].append(c)
            arrivals = {k: c.arrival for k, c in members.items()}
            latest = max(arrivals, key=lambda k: arrivals[k])
            last[latest] += 1
            others = [a for k, a in arrivals.items() if k != latest]
            lags[latest].append((arrivals[latest] - statistics.median(others)) * 1e9)
        key, times = max(last.items(), key=lambda kv: kv[1])
        share = times / rounds
        lag_ns = statistics.median(lags[key])
        if share < PEER_LAST_SHARE or lag_ns < PEER_MIN_LAG_NS:
            continue
        node, pid = key
        rank = next((c.rank for c in ranks[key] if c.rank is not None), None)
        who = (f"rank {rank}" if rank is not None else process_name(t, pid)) + (
            f" on {node}" if node else ""
        )
        sig = Signal(
            id="peer_lag",
            layer="nccl",
            text=f"{who} reaches {op} last in {times} of {rounds} collectives of communicator"
            f" {comm[:8]}, {fmt_ns(lag_ns)} after the others (median)",
            strength=math.log2(1 + lag_ns / 1e6) * share,
            evidence={
                "communicator": comm,
                "op": op,
                "late_rank": rank,
                "late_pid": pid,
                "late_node": node,
                "rounds": rounds,
                "last_in": times,
                "median_lag_ns": round(lag_ns),
                "ranks": len(ranks),
                # "seq": joined by the tracer's sequence numbers; "position": the i-th
                # call of each rank (a node DB older than v3 among the ranks)
                "joined_by": "seq"
                if all(c.seq is not None for m in full for c in m.values())
                else "position",
            },
            pids=frozenset(p for _, p in ranks),
            onset=min(c.ts for c in ranks[key]),
            series={},
        )
        if worst is None or sig.strength > worst[0]:
            worst = (sig.strength, sig)
    return worst[1] if worst else None
