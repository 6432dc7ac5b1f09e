"""What Fleet keeps of one NCCL communicator between ticks: its ranks' latest reports, its
joined collectives, and its open episodes (peer_lag, collective_hang, collective_wait).

Their own room: the join and lag judging (:mod:`ingero.fleet.collectives`) and the stop
judging (:mod:`ingero.fleet.collective_stops`) both read and write these records; kept
here, neither of the two imports the other for them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ingero.fleet.threshold import BoolArray, FloatArray, IntArray
from ingero.otlp.collectives import CommReport

DETECTION_MODE = "fleet"

CommKey = tuple[str, str, str]  # (cluster_id, peer group, comm_hash)


@dataclass
class RankState:
    """One rank's latest report of a communicator, and where it came from.

    ``report`` is kept without its calls, and ``ops`` holds their (seq, op) as plain tuples:
    a ``CollectiveCall`` is a tuple subclass, which CPython's cyclic GC never stops tracking,
    so 16 of them per rank kept for a tick interval made every full collection walk
    hundreds of thousands of objects (at 10,000 ranks it cost more than the push itself);
    plain tuples of ints and strings drop out of the GC's lists after its first pass.
    """

    node_id: str
    slurm_rank: int | None
    report: CommReport
    offset_ns: int
    offset_known: bool
    seen: float  # monotonic time of the push that carried it
    # (seq, op, entry on Fleet's clock in ns) of the report's sampled calls
    ops: tuple[tuple[int, str, int], ...] = ()
    # Fleet's Unix time (s) the report is as of: its tracer interval's end, on Fleet's
    # clock (an older node's: the push's arrival).
    as_of: float = 0.0
    quiet: bool = False  # the node launches nothing while its job runs (ingero.node.quiet)


@dataclass
class JoinedRow:
    """One joined collective: the ranks that reported it, their lag behind the median entry
    (ns), which of them were late by the robust rule, and the rank that entered last."""

    seq: int
    op: str
    bytes: int
    ranks: IntArray
    lag_ns: FloatArray
    wait_ns: FloatArray  # the barrier wait: the last entry - the rank's own
    late: BoolArray
    last_rank: int


@dataclass
class LagEpisode:
    event_id: str
    since: float
    node_id: str
    slurm_rank: int | None
    lag_s: float
    # Its last start event: the lag it said, the joined collectives then, and how many
    # re-emits since the first (a start's figures are those of the window it opened in).
    said_lag_s: float = 0.0
    said_at: int = 0
    repeats: int = 0


@dataclass
class Hang:
    event_id: str
    seq: int
    op: str
    since: float
    missing: list[int]


@dataclass
class Wait:
    """A communicator stopped at one collective for ``nccl.wait_after``: the ranks behind
    it (``missing``, the ones the others wait for), or none when every rank stopped at it."""

    event_id: str
    seq: int
    op: str
    since: float  # Fleet's Unix time the wait began (the first arrival at ``seq``)
    missing: list[int]
    waiting: list[int]  # the ranks inside or past it


@dataclass
class Comm:
    cluster_id: str
    group: str
    job_id: str | None
    comm_hash: str
    nranks: int
    ranks: dict[int, RankState] = field(default_factory=dict)
    # The tick's copy of ``ranks``, which it works on without the lock (ingest goes on).
    view: dict[int, RankState] = field(default_factory=dict)
    # seq -> rank -> (entry on Fleet's clock in ns, bytes, op)
    pending: dict[int, dict[int, tuple[float, int, str]]] = field(default_factory=dict)
    quorum_tick: dict[int, int] = field(default_factory=dict)
    joined_seq: int = 0
    rows: deque[JoinedRow] = field(default_factory=deque)
    joined_total: int = 0  # collectives joined since the communicator was seen: a lag's clock
    lagging: dict[int, LagEpisode] = field(default_factory=dict)
    hang: Hang | None = None
    wait: Wait | None = None


@dataclass(frozen=True)
class NcclNamed:
    """An open episode that names a node's rank: what the node's push reply carries."""

    type: str  # collective_hang (the others wait for it) or peer_lag
    event_id: str
    since: float  # Fleet's Unix time the episode began
    op: str | None = None  # the collective: a hang's, or the lag window's most common op
    seq: int | None = None  # a hang's sequence number
