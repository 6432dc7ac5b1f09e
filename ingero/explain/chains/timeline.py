"""The input of the chains: the per-interval rows of both windows, as plain values."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class OpPoint:
    """One ``intervals`` row: a (pid, source, op) over one tracer interval."""

    ts_start: float
    ts_end: float
    pid: int
    source: str
    op: str
    count: int
    total_ns: int
    p95_ns: float
    errors: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class HostPoint:
    ts_start: float
    ts_end: float
    offcpu_ns: int = 0
    page_allocs: int = 0
    block_io_count: int = 0
    block_io_p99_ns: int | None = None
    tcp_retransmits: int = 0


@dataclass(frozen=True)
class GpuPoint:
    """One ``gpu_intervals`` row; throttle/XID only where the node DB records them."""

    ts_start: float
    ts_end: float
    gpu: int
    busy_ns: int | None = None
    throttled: bool = False
    throttle_detail: str | None = None  # e.g. "throttle_reasons=0x40 (hw_thermal_slowdown)"
    xid: int | None = None


@dataclass(frozen=True)
class CollectiveCall:
    """One sampled NCCL collective (``raw_events`` or ``nccl_calls``); ``ts`` is when it
    returned (its arrival where it had not returned when written: then ``duration_ns`` is 0
    and ``returned`` False). ``seq``: its number on its communicator in its process, where
    the tracer numbered it (node DB v3), else None."""

    ts: float
    duration_ns: int
    pid: int
    op: str
    comm_hash: str
    rank: int | None = None
    node: str | None = None
    seq: int | None = None
    returned: bool = True

    @property
    def arrival(self) -> float:
        return self.ts - self.duration_ns / 1e9


# Which collective a call is part of: (communicator hash, op, number). The number is the
# call's ``seq`` where every call of its communicator has one, else its position among its
# rank's calls of that communicator and op.
CollectiveId = tuple[str, str, int]
RankKey = tuple[str | None, int]  # (node, pid)


def join_collectives(
    calls: Iterable[CollectiveCall],
) -> dict[CollectiveId, dict[RankKey, CollectiveCall]]:
    """The ranks' calls of each collective, joined across ranks (and nodes).

    Where the tracer numbered a communicator's collectives (node DB v3: ``nccl_calls`` and
    ``raw_events.detail.seq``), one collective is its (communicator, seq) on every rank, so
    a rank whose sample misses a call leaves the others' collectives where they are. A
    communicator with any call without a number (an older node DB among the ranks) falls
    back to "the i-th call of each rank (per op) is one collective", which one missing
    sample shifts. A call seen twice (the same rank and key) is kept once, the first.
    """
    by_comm: dict[str, list[CollectiveCall]] = defaultdict(list)
    for c in calls:
        by_comm[c.comm_hash].append(c)
    out: dict[CollectiveId, dict[RankKey, CollectiveCall]] = defaultdict(dict)
    for comm, members in by_comm.items():
        if all(c.seq is not None for c in members):
            for c in members:
                assert c.seq is not None
                out[(comm, c.op, c.seq)].setdefault((c.node, c.pid), c)
            continue
        position: dict[tuple[str, RankKey], int] = defaultdict(int)
        for c in sorted(members, key=lambda c: c.ts):
            i = position[(c.op, (c.node, c.pid))]
            position[(c.op, (c.node, c.pid))] = i + 1
            out[(comm, c.op, i)][(c.node, c.pid)] = c
    return dict(out)


@dataclass(frozen=True)
class Process:
    pid: int
    comm: str | None = None
    job_id: str | None = None
    rank: int | None = None


@dataclass(frozen=True)
class Timeline:
    """Rows with ``ts_end`` in ``(start, end]``; the recent window is ``(split, end]``."""

    start: float
    split: float
    end: float
    ops: tuple[OpPoint, ...] = ()
    host: tuple[HostPoint, ...] = ()
    gpus: tuple[GpuPoint, ...] = ()
    collectives: tuple[CollectiveCall, ...] = ()
    processes: Mapping[int, Process] = field(default_factory=dict)
