"""CollectiveJoin: Fleet's join of NCCL ranks, peer_lag and collective_hang (table-driven,
driven by ManualClock; the pushes are built as a node's tracer would report them)."""

from __future__ import annotations

import gc
import re
import threading
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ingero.fleet.collectives import CollectiveJoin, NcclTick
from ingero.fleet.config import FleetConfig, NcclConfig, QuorumConfig, ThresholdConfig
from ingero.fleet.model import TickResult
from ingero.fleet.state import FleetState
from ingero.otlp.collectives import ClockOffset, CollectiveCall, CommReport, sample_calls
from ingero.otlp.health import NodePush
from ingero.otlp.threshold import ThresholdView
from ingero.runtime.clock import ManualClock
from ingero.schema.events import MESSAGE_IDS, Event
from ingero.slurm.drain_policy import drain_reason

ROOT = Path(__file__).resolve().parents[3]
HASH = "9f1c2e3d4a5b6c7d"
INTERVAL = 1.0  # push interval and tick (s)
PERIOD = 0.05  # one collective every 50 ms: 20 per interval
TTL = 5.0


@dataclass
class Sim:
    """A job whose ranks enter one all-reduce every PERIOD on Fleet's clock, each ``delay``
    late; ``skew`` is what each node adds to its clock to read Fleet's (it reports it unless
    ``unreported``); ``limit`` caps a rank's sampled calls per push (the node's sampling)."""

    nranks: int
    node_of: dict[int, str]
    delay: dict[int, float] = field(default_factory=dict)
    skew: dict[str, float] = field(default_factory=dict)
    unreported: set[str] = field(default_factory=set)
    limit: dict[int, int] = field(default_factory=dict)
    stop_before: dict[int, int] = field(default_factory=dict)  # rank -> first seq it never enters
    silent: set[str] = field(default_factory=set)  # nodes that stopped pushing
    comm_hash: str = HASH
    seq: int = 0
    config: NcclConfig = field(default_factory=NcclConfig)
    clock: ManualClock = field(default_factory=ManualClock)
    join: CollectiveJoin | None = None
    events: list[Event] = field(default_factory=list)
    ticks: int = 0
    block_at: int | None = None  # every rank that gets there stays inside this seq
    # Real NCCL: the call to ``block_at`` returns at enqueue, and the rank waits in a stream
    # sync after it (it enters nothing more); without it the rank stays inside the call.
    asynchronous: bool = False
    # Through a FleetState (its ingest and tick) instead of the bare join.
    state: FleetState | None = None
    score: dict[str, float] = field(default_factory=dict)
    replies: dict[str, ThresholdView] = field(default_factory=dict)
    tick: TickResult | None = None
    cluster: str = "c1"
    # Nodes whose pushes say they launch nothing (ingero.node.quiet).
    quiet: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.join = CollectiveJoin(self.config, TTL)

    def node_time_ns(self, node: str, fleet_s: float) -> int:
        return round((fleet_s - self.skew.get(node, 0.0)) * 1e9)

    def interval(self, collectives: int = round(INTERVAL / PERIOD)) -> NcclTick:
        """One push interval: ``collectives`` more collectives, every node pushes, a tick."""
        start = self.clock.now()
        calls: dict[int, list[CollectiveCall]] = {r: [] for r in range(self.nranks)}
        first = self.seq + 1
        for i in range(collectives):
            seq = first + i
            for rank in range(self.nranks):
                if seq >= self.stop_before.get(rank, 1 << 62):
                    continue
                if self.block_at is not None and seq > self.block_at:
                    continue
                enter = start + i * PERIOD + self.delay.get(rank, 0.0)
                node = self.node_of[rank]
                blocked = seq == self.block_at and not self.asynchronous
                returned = None if blocked else self.node_time_ns(node, enter + 0.001)
                calls[rank].append(
                    CollectiveCall(
                        seq, "ncclAllReduce", self.node_time_ns(node, enter), returned, 4096
                    )
                )
        self.seq += collectives
        self.clock.advance(INTERVAL)
        assert self.join is not None
        for node in sorted(set(self.node_of.values()) - self.silent):
            reports = []
            for rank in sorted(r for r, n in self.node_of.items() if n == node):
                mine = calls[rank]
                entered = mine[-1].seq if mine else self.last_entered(rank)
                inflight = [c for c in mine if c.returned_ns is None]
                returned = max((c.seq for c in mine if c.returned_ns), default=entered)
                if inflight or (self.inside(rank) and not self.asynchronous):
                    returned = entered - 1
                reports.append(
                    CommReport(
                        comm_hash=self.comm_hash,
                        comm_rank=rank,
                        nranks=self.nranks,
                        entered_seq=entered,
                        returned_seq=returned,
                        calls_in_interval=len(mine),
                        last_enter_ns=self.enter_ns(rank, entered),
                        calls=tuple(sample_calls(mine, self.limit.get(rank, 64))),
                        as_of_ns=self.node_time_ns(node, self.clock.now()),
                    )
                )
            clock = (
                None if node in self.unreported else ClockOffset(self.skew.get(node, 0.0), 0.001)
            )
            push = NodePush(
                node_id=node,
                cluster_id=self.cluster,
                score=self.score.get(node, 0.9),
                job_id="1234",
                rank=int(node[1:]) if node[1:].isdigit() else None,
                collectives=tuple(reports),
                clock=clock,
                quiet=node in self.quiet,
            )
            if self.state is not None:
                self.replies[node] = self.state.ingest(push)
            else:
                self.join.ingest(push, self.clock.monotonic(), self.clock.now())
        self.ticks += 1
        if self.state is not None:
            self.tick = self.state.tick()
            self.events.extend(self.tick.events)
            return NcclTick((), {}, {}, self.tick.nccl_comms, self.tick.hung_comms, 0, 0)
        result = self.join.tick(self.clock.now(), self.clock.monotonic())
        self.events.extend(result.events)
        return result

    def last_entered(self, rank: int) -> int:
        top = self.seq
        if self.block_at is not None:
            top = min(top, self.block_at)
        return min(top, self.stop_before.get(rank, 1 << 62) - 1)

    def inside(self, rank: int) -> bool:
        return self.block_at is not None and self.last_entered(rank) == self.block_at

    def enter_ns(self, rank: int, seq: int) -> int:
        """Entry time of ``seq`` on the rank's node clock (seqs are PERIOD apart in time)."""
        per = round(INTERVAL / PERIOD)  # every interval() runs that many collectives here
        fleet_s = ManualClock().now() + ((seq - 1) // per) * INTERVAL + ((seq - 1) % per) * PERIOD
        return self.node_time_ns(self.node_of[rank], fleet_s + self.delay.get(rank, 0.0))

    def of(self, kind: str, state: str = "start") -> list[Event]:
        return [e for e in self.events if e.type == kind and e.extra.get("state") == state]


def one_per_node(nranks: int) -> dict[int, str]:
    return {r: f"n{r}" for r in range(nranks)}


# ---- join and peer_lag ----------------------------------------------------------------


@dataclass(frozen=True)
class LagCase:
    name: str
    nranks: int
    node_of: dict[int, str]
    delay: dict[int, float]
    flagged: dict[int, float]  # comm rank -> expected lag (s), within 20%
    skew: dict[str, float] = field(default_factory=dict)
    unreported: frozenset[str] = frozenset()
    limit: dict[int, int] = field(default_factory=dict)


LAG_CASES = [
    LagCase("one late rank", 8, one_per_node(8), {5: 0.2}, {5: 0.2}),
    LagCase("healthy jitter", 8, one_per_node(8), {1: 0.002, 2: 0.004, 3: 0.001}, {}),
    LagCase("two late ranks", 16, one_per_node(16), {3: 0.2, 11: 0.1}, {3: 0.2, 11: 0.1}),
    LagCase(
        "clock offsets applied",
        8,
        one_per_node(8),
        {5: 0.2},
        {5: 0.2},
        # Node clocks off by seconds, each reported: joined on Fleet's clock, no false lag.
        skew={"n1": 3.0, "n2": -2.5, "n5": 1.25},
    ),
    LagCase(
        "offset unknown counts as 0",
        8,
        one_per_node(8),
        {},
        # n2's clock is 300 ms behind and it never reported an offset: it looks late.
        {2: 0.3},
        skew={"n2": -0.3},
        unreported=frozenset({"n2"}),
    ),
    LagCase(
        "sampled seqs with different strides",
        8,
        one_per_node(8),
        {6: 0.2},
        {6: 0.2},
        # 20 calls per push: rank 0 keeps 8 (stride 4), ranks 1-3 keep 16 (stride 2).
        limit={0: 8, 1: 16, 2: 16, 3: 16},
    ),
    LagCase(
        "ranks of one comm on one node (8 GPUs)",
        16,
        {r: f"n{r // 8}" for r in range(16)},
        {9: 0.2},
        {9: 0.2},
    ),
]


@pytest.mark.parametrize("case", LAG_CASES, ids=lambda c: c.name)
def test_peer_lag(case: LagCase) -> None:
    sim = Sim(
        case.nranks,
        case.node_of,
        delay=case.delay,
        skew=case.skew,
        unreported=set(case.unreported),
        limit=case.limit,
    )
    last = None
    for _ in range(4):
        last = sim.interval()
    assert last is not None
    assert last.joined > 0
    started = sim.of("peer_lag")
    assert {e.extra["comm_rank"] for e in started} == set(case.flagged)
    for event in started:
        rank = event.extra["comm_rank"]
        assert event.node_id == case.node_of[rank]
        assert event.job_id == "1234"
        assert event.extra["comm_hash"] == HASH
        assert event.extra["op"] == "ncclAllReduce"
        assert event.extra["bytes"] == 4096
        assert event.extra["lag_p50_ms"] == pytest.approx(case.flagged[rank] * 1e3, rel=0.2)
        if len(case.flagged) == 1:  # the others wait for it at the barrier
            assert event.extra["peers_wait_p50_ms"] == pytest.approx(
                case.flagged[rank] * 1e3, rel=0.2
            )
        # Judged on a quarter window at least (while the window fills, a share of what it holds).
        assert event.extra["collectives"] >= max(2, sim.config.window // 4)
        assert event.extra["clock_offset_known"] == (case.node_of[rank] not in case.unreported)
        # The node's lag as push replies carry it.
        assert last.peer_lag[(event.cluster_id, event.node_id)] == pytest.approx(
            case.flagged[rank], rel=0.2
        )
    latest = max(case.flagged, key=lambda r: case.flagged[r], default=None)
    if latest is not None:
        lags = {f.comm_rank: f for f in sim.join.rank_lags("c1", "c1/job/1234", HASH)}  # type: ignore[union-attr]
        assert lags[latest].last_count == max(f.last_count for f in lags.values())
    assert len(started) == len(case.flagged)  # one episode each, not one per tick


def test_a_rank_late_from_the_first_collectives_is_judged_while_the_window_fills() -> None:
    """A job's first collectives: a rank late in most of them opens its episode once a
    quarter window is joined, not after more than half a full window; its on-time peers in
    the same collectives open none."""
    sim = Sim(8, one_per_node(8), delay={5: 0.2}, config=NcclConfig(window=40))
    sim.interval(collectives=3)  # 3 joined: fewer than a quarter window (10)
    assert sim.of("peer_lag") == []
    sim.interval(collectives=8)  # 11 joined: late in all, more than half of 11, not of 40
    (start,) = sim.of("peer_lag")
    assert start.extra["comm_rank"] == 5
    assert (start.extra["collectives"], start.extra["late_count"]) == (11, 11)
    sim.interval(collectives=30)  # the window full: the one episode, still open
    assert sim.of("peer_lag") == [start] and sim.of("peer_lag", "end") == []


def test_a_rank_late_in_one_step_s_collectives_is_not_a_straggler() -> None:
    """A one-off pause of a rank (a GC, a checkpoint it writes alone) makes it late in the
    rest of one step's collectives, fewer than the share of a full window that opens an
    episode: its peers wait for it once, and no peer_lag names it."""
    sim = Sim(8, one_per_node(8))
    sim.interval(collectives=20)  # the window full, every rank on time
    sim.delay = {5: 0.5}
    sim.interval(collectives=8)  # one step of 8 collectives, rank 5 late in each
    sim.delay = {}
    sim.interval(collectives=20)
    assert sim.of("peer_lag") == []


def test_lag_episode_ends_with_the_same_id() -> None:
    sim = Sim(8, one_per_node(8), delay={4: 0.2})
    for _ in range(3):
        sim.interval()
    (start,) = sim.of("peer_lag")
    sim.delay = {}
    for _ in range(3):
        result = sim.interval()
    (end,) = sim.of("peer_lag", "end")
    assert end.event_id == start.event_id
    assert end.extra["reason"] == "recovered"
    assert result.peer_lag == {}


def test_two_ranks_are_not_judged() -> None:
    """With two ranks the median sits between them: who is late cannot be told."""
    sim = Sim(2, one_per_node(2), delay={1: 0.2})
    for _ in range(4):
        sim.interval()
    assert sim.of("peer_lag") == []


def test_comm_recreated_with_a_new_hash() -> None:
    sim = Sim(8, one_per_node(8), delay={3: 0.2})
    for _ in range(3):
        sim.interval()
    (start,) = sim.of("peer_lag")
    # ncclCommDestroy + ncclCommInitRank: a new hash, sequence numbers from 1 again.
    sim.comm_hash, sim.seq = "00000000000000ab", 0
    sim.delay = {}
    for _ in range(int(TTL / INTERVAL) + 2):
        result = sim.interval()
    (end,) = sim.of("peer_lag", "end")
    assert end.event_id == start.event_id and end.extra["reason"] == "expired"
    assert end.extra["comm_hash"] == HASH
    assert result.comms == 1  # the old communicator is gone
    assert sim.of("peer_lag") == [start]  # the new one's ranks are on time


def test_node_that_stops_pushing_expires() -> None:
    sim = Sim(8, one_per_node(8), delay={6: 0.2})
    for _ in range(3):
        sim.interval()
    (start,) = sim.of("peer_lag")
    sim.silent = {"n6"}
    sim.stop_before = {6: sim.seq + 1}
    ticks = 0
    while not sim.of("peer_lag", "end"):
        result = sim.interval()
        ticks += 1
        assert ticks <= TTL / INTERVAL + 1
    (end,) = sim.of("peer_lag", "end")
    assert end.event_id == start.event_id and end.extra["reason"] == "expired"
    assert ("c1", "n6") not in result.peer_lag


# ---- collective_hang ------------------------------------------------------------------


@dataclass(frozen=True)
class HangCase:
    name: str
    nranks: int
    node_of: dict[int, str]
    stop_before: dict[int, int]  # rank -> the seq it never enters (relative to the block)
    missing: list[int]


HANG_CASES = [
    HangCase("one rank never arrives", 8, one_per_node(8), {5: 0}, [5]),
    # The wavefront: ranks 2 and 3 stopped one and two collectives earlier.
    HangCase("wavefront", 8, one_per_node(8), {2: 0, 3: -1}, [2, 3]),
    HangCase("every rank inside", 8, one_per_node(8), {}, []),
    HangCase(
        "one node of 8 GPUs", 16, {r: f"n{r // 8}" for r in range(16)}, {9: 0, 10: 0}, [9, 10]
    ),
]


def run_to_hang(sim: Sim, case: HangCase) -> tuple[Event, int]:
    """One interval, then every rank blocks at a collective inside the next one (the
    case's ranks stop short of it); intervals until the hang is raised: (it, the seq)."""
    sim.interval()
    block = sim.seq + 10  # inside the next interval
    sim.block_at = block
    sim.stop_before = {r: block + rel for r, rel in case.stop_before.items()}
    ticks = 0
    while not sim.of("collective_hang"):
        sim.interval()
        ticks += 1
        assert ticks < 20
    (hang,) = sim.of("collective_hang")
    return hang, block


@pytest.mark.parametrize("case", HANG_CASES, ids=lambda c: c.name)
def test_collective_hang(case: HangCase) -> None:
    config = NcclConfig(hang_after=3.0)
    sim = Sim(case.nranks, case.node_of, config=config)
    hang, block = run_to_hang(sim, case)
    # Blocked half an interval into the first one, detected on the first tick past the bound.
    assert hang.extra["inside_for_s"] >= config.hang_after
    assert hang.extra["inside_for_s"] < config.hang_after + INTERVAL
    assert hang.extra["seq"] == block
    assert hang.extra["op"] == "ncclAllReduce"
    assert hang.extra["missing_ranks"] == case.missing
    assert hang.extra["missing_nodes"] == sorted({case.node_of[r] for r in case.missing})
    assert hang.extra["inside_ranks"] == [r for r in range(case.nranks) if r not in case.missing]
    assert hang.node_id == (case.node_of[case.missing[0]] if case.missing else "")
    if not case.missing:
        assert hang.extra["reason"].startswith("all_ranks_inside")
    # One event per hang, not one per tick; the end once it moves on.
    result = sim.interval()
    assert len(sim.of("collective_hang")) == 1
    # The nodes of the missing ranks are named (their push replies say so), no other.
    since = hang.timestamp - hang.extra["inside_for_s"]
    assert sorted(result.named) == [("c1", n) for n in hang.extra["missing_nodes"]]
    for named in result.named.values():
        assert (named.type, named.event_id) == ("collective_hang", hang.event_id)
        assert (named.op, named.seq) == ("ncclAllReduce", block)
        assert named.since == pytest.approx(since, abs=1e-3)
    sim.block_at, sim.stop_before = None, {}
    sim.interval()
    (end,) = sim.of("collective_hang", "end")
    assert end.event_id == hang.event_id and end.extra["reason"] == "moved_on"
    assert end.extra["missing_nodes"] == hang.extra["missing_nodes"]


@pytest.mark.parametrize("case", [c for c in HANG_CASES if c.missing], ids=lambda c: c.name)
def test_collective_hang_when_the_calls_return_at_enqueue(case: HangCase) -> None:
    """Real NCCL returns from ncclAllReduce once it is enqueued: the ranks that wait for a
    missing peer entered N and returned, and enter nothing more (they wait in a stream
    sync). The wavefront is named all the same, on the first tick past the bound, and the
    hang ends when the missing ranks arrive, even if nothing follows N."""
    config = NcclConfig(hang_after=3.0)
    sim = Sim(case.nranks, case.node_of, config=config, asynchronous=True)
    hang, block = run_to_hang(sim, case)
    assert config.hang_after <= hang.extra["inside_for_s"] < config.hang_after + INTERVAL
    assert (hang.extra["seq"], hang.extra["op"]) == (block, "ncclAllReduce")
    assert hang.extra["missing_ranks"] == case.missing
    assert hang.extra["inside_ranks"] == [r for r in range(case.nranks) if r not in case.missing]
    assert hang.extra["in_call_count"] == 0
    assert hang.extra["reason"] == "missing_ranks"
    sim.interval()
    assert len(sim.of("collective_hang")) == 1
    sim.stop_before = {}  # the missing ranks enter N (and, as the others, nothing after)
    sim.interval()
    (end,) = sim.of("collective_hang", "end")
    assert end.event_id == hang.event_id and end.extra["reason"] == "moved_on"


def test_every_rank_past_the_call_is_not_a_hang() -> None:
    """Every rank entered N and returned, and none entered anything since: computing
    between collectives (an evaluation, a checkpoint) looks the same as a fabric hang
    once the calls return at enqueue, so nothing is raised, however long."""
    sim = Sim(8, one_per_node(8), config=NcclConfig(hang_after=3.0), asynchronous=True)
    sim.interval()
    sim.block_at = sim.seq + 10
    for _ in range(10):
        result = sim.interval()
    assert sim.of("collective_hang") == []
    assert result.hung == 0


def test_no_hang_below_the_bound() -> None:
    sim = Sim(8, one_per_node(8), config=NcclConfig(hang_after=30.0))
    sim.interval()
    sim.block_at = sim.seq + 3
    sim.stop_before = {1: sim.block_at}
    for _ in range(10):
        result = sim.interval()
    assert sim.of("collective_hang") == []
    assert result.hung == 0


# ---- bounds ---------------------------------------------------------------------------


def test_communicators_are_capped_per_group_and_in_all() -> None:
    join = CollectiveJoin(NcclConfig(max_comms=3, max_comms_per_group=2), TTL)
    clock = ManualClock()

    def report(h: str) -> CommReport:
        return CommReport(comm_hash=h, comm_rank=0, nranks=4, entered_seq=1)

    for job, hashes in (("a", [f"{i:016x}" for i in range(1, 4)]), ("b", [f"{9:016x}"] * 2)):
        join.ingest(
            NodePush(
                node_id=f"n{job}",
                cluster_id="c1",
                score=0.9,
                job_id=job,
                collectives=tuple(report(h) for h in hashes),
            ),
            clock.monotonic(),
        )
    result = join.tick(clock.now(), clock.monotonic())
    assert result.comms == 3  # job a: 2 of 3 (per group), job b: its one
    assert result.refused == 1


def test_pending_sequences_are_bounded() -> None:
    """A rank that sends no sampled calls: no collective of its small communicator ever
    joins, and what waits for it stays bounded."""
    config = NcclConfig(max_pending=16)
    sim = Sim(4, one_per_node(4), config=config, limit={3: 0})
    join = sim.join
    assert join is not None
    for _ in range(5):
        sim.interval()
    comm = next(iter(join._comms.values()))
    assert len(comm.pending) <= 16


def test_clock_offsets_are_kept_per_node() -> None:
    sim = Sim(4, one_per_node(4), skew={"n1": 0.5}, unreported={"n3"})
    sim.interval()
    offsets = {node: off for _, node, off, _ in sim.join.clock_offsets()}  # type: ignore[union-attr]
    assert offsets == {"n0": 0.0, "n1": 0.5, "n2": 0.0}


def _reachable(root: object) -> list[object]:
    """Every object the cyclic GC sees from ``root`` (classes and modules not entered)."""
    seen: dict[int, object] = {}
    todo = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, type | types.ModuleType):
            continue
        seen[id(obj)] = obj
        todo.extend(gc.get_referents(obj))
    return list(seen.values())


def test_the_join_keeps_no_call_objects_the_gc_must_walk() -> None:
    # A CollectiveCall (a tuple subclass) stays on the cyclic GC's lists for life: kept per
    # rank for a tick, 16 a push, they made every full collection of a 10,000-node Fleet
    # walk hundreds of thousands of them. The join keeps plain tuples, which drop off.
    sim = Sim(4, one_per_node(4), block_at=30)
    sim.interval()
    sim.interval()
    kept = _reachable(sim.join)
    assert not [o for o in kept if isinstance(o, CollectiveCall)]
    assert [o for o in kept if type(o) is tuple and o[:1] == (30,)]  # the calls' (seq, op)
    sim.clock.advance(sim.config.hang_after + INTERVAL)
    sim.interval(0)
    (hang,) = sim.of("collective_hang")
    assert (hang.extra["seq"], hang.extra["op"]) == (30, "ncclAllReduce")


# ---- through FleetState: replies, the straggler view, the drain rules' inputs ----------


def state_sim(nodes: int, statistical_min: int = 5, **kw: object) -> Sim:
    clock = ManualClock()
    config = FleetConfig(
        threshold=ThresholdConfig(ema_alpha=1.0),
        quorum=QuorumConfig(statistical_min=statistical_min),
        push_interval=INTERVAL,  # type: ignore[arg-type]
        ttl_multiplier=TTL / INTERVAL,
    )
    return Sim(nodes, one_per_node(nodes), clock=clock, state=FleetState(config, clock), **kw)  # type: ignore[arg-type]


def test_a_lagging_node_is_flagged_only_in_its_own_cluster() -> None:
    """Two clusters whose nodes bear the same names (every Slurm site has an n5): the lag
    of A's n5 is A's, never in the reply to B's n5 or B's straggler view."""
    a = state_sim(8, delay={5: 0.2})
    b = Sim(8, one_per_node(8), clock=a.clock, state=a.state, cluster="c2")
    for _ in range(4):
        a.interval()
        b.interval()
    assert a.replies["n5"].peer_lag == pytest.approx(0.2, rel=0.2)
    assert b.replies["n5"].peer_lag is None
    assert a.state is not None and a.state.node_count() == 16
    api = a.state.threshold_view("c2", "1234", node_id="n5")
    assert api is not None and api.peer_lag is None
    assert b.tick is not None
    (verdict,) = b.tick.verdicts
    assert (verdict.cluster_id, verdict.node_id, verdict.reason) == ("c1", "n5", "peer_lag")
    offsets = {(c, n) for c, n, _, _ in a.state.clock_offsets()}
    assert ("c1", "n5") in offsets and ("c2", "n5") in offsets


def test_peer_lag_makes_a_fleet_straggler_and_reaches_the_replies() -> None:
    sim = state_sim(8, delay={5: 0.2})
    for _ in range(4):
        sim.interval()
    (lag,) = sim.of("peer_lag")
    assert lag.node_id == "n5" and lag.rank == 5
    # The reply to n5's next push and the API's view of n5 carry its lag; others' do not.
    assert sim.replies["n5"].peer_lag == pytest.approx(0.2, rel=0.2)
    assert sim.replies["n4"].peer_lag is None
    # and the episode that names it, so the node snapshots its stacks under that id
    reply = sim.replies["n5"]
    assert (reply.nccl_episode_type, reply.nccl_episode_id) == ("peer_lag", lag.event_id)
    assert reply.nccl_episode_since == pytest.approx(lag.timestamp)
    assert (reply.nccl_episode_op, reply.nccl_episode_seq) == (lag.extra["op"], None)
    assert sim.replies["n4"].nccl_episode_id is None
    assert sim.state is not None
    api = sim.state.threshold_view("c1", "1234", node_id="n5")
    assert api is not None and api.peer_lag == pytest.approx(0.2, rel=0.2)
    # Fleet's own straggler view counts it (its score is as good as its peers').
    (started,) = [e for e in sim.events if e.type == "straggler_state"]
    assert started.node_id == "n5" and started.extra["reason"] == "peer_lag"
    assert sim.tick is not None
    (verdict,) = sim.tick.verdicts
    assert verdict.node_id == "n5" and verdict.quorum_met and not verdict.panic
    assert verdict.consecutive_straggler_ticks >= 1
    # The verdict names the lagging rank, and a drain for it says so (not its score).
    assert verdict.reason == "peer_lag" and verdict.peer_lag is not None
    assert verdict.peer_lag.comm_rank == 5
    assert verdict.peer_lag.comm_hash == lag.extra["comm_hash"]
    assert verdict.peer_lag.lag_s == pytest.approx(0.2, rel=0.2)
    ms = f"{verdict.peer_lag.lag_s * 1e3:.0f}"
    assert drain_reason(verdict) == (
        f"ingero: peer_lag rank 5 of comm {lag.extra['comm_hash']} {ms} ms late (job 1234)"
        " class=unknown"
    )
    # Recovers: the lag episode ends, and with it the straggler episode.
    sim.delay = {}
    for _ in range(3):
        sim.interval()
    (resolved,) = [e for e in sim.events if e.type == "straggler_resolved"]
    assert resolved.event_id == started.event_id and resolved.extra["reason"] == "recovered"
    assert sim.tick.verdicts == ()


def test_a_lag_episode_names_its_lag_until_it_ends() -> None:
    """Once the lag clears, the episode waits for the exit rule (exit_intervals ticks at
    the recovery level); its verdicts meanwhile still name the lag that made the node a
    straggler, so a drain decided then does not give a score above its threshold as the
    cause."""
    sim = state_sim(8, delay={5: 0.2})
    for _ in range(4):
        sim.interval()
    assert sim.tick is not None
    (lagging,) = sim.tick.verdicts
    assert lagging.peer_lag is not None
    sim.delay = {}
    waiting = []
    for _ in range(4):
        sim.interval()
        assert sim.tick is not None and sim.state is not None
        if not sim.state.threshold_view("c1", "1234", node_id="n5").peer_lag:  # type: ignore[union-attr]
            waiting.extend(sim.tick.verdicts)
    assert waiting, "no tick between the lag clearing and the episode's end"
    for verdict in waiting:
        assert verdict.node_id == "n5" and verdict.score > verdict.threshold  # type: ignore[operator]
        assert verdict.reason == "peer_lag"
        assert verdict.peer_lag == lagging.peer_lag
        assert drain_reason(verdict).startswith("ingero: peer_lag rank 5 of comm ")
    (resolved,) = [e for e in sim.events if e.type == "straggler_resolved"]
    assert resolved.extra["reason"] == "recovered"
    assert sim.tick.verdicts == ()


def test_a_lag_episode_held_by_the_hysteresis_still_names_its_lag() -> None:
    """A score at the threshold but under threshold + hysteresis never starts the exit
    count: the episode goes on, and it is still the lag's, not a score's."""
    sim = state_sim(8, delay={5: 0.2})
    for _ in range(4):
        sim.interval()
    sim.delay, sim.score["n5"] = {}, 0.87  # threshold 0.86, hysteresis 0.02
    verdicts = []
    for _ in range(4):
        sim.interval()
        assert sim.tick is not None
        verdicts.extend(sim.tick.verdicts)
    assert len(verdicts) == 4
    for verdict in verdicts:
        assert verdict.node_id == "n5" and verdict.threshold is not None
        assert verdict.threshold <= verdict.score < verdict.threshold + 0.02
        assert verdict.reason == "peer_lag" and verdict.peer_lag is not None


def test_a_lag_episode_whose_score_falls_below_is_a_score_episode() -> None:
    sim = state_sim(8, delay={5: 0.2})
    for _ in range(4):
        sim.interval()
    sim.delay, sim.score["n5"] = {}, 0.5
    for _ in range(3):
        sim.interval()
    assert sim.tick is not None
    (verdict,) = sim.tick.verdicts
    assert verdict.node_id == "n5" and verdict.score < verdict.threshold  # type: ignore[operator]
    assert (verdict.reason, verdict.peer_lag) == ("score", None)
    assert drain_reason(verdict).startswith("ingero: straggler score=0.50 ")


def test_peer_lag_without_group_quorum_is_an_event_not_a_straggler() -> None:
    """Three nodes are a communicator Fleet can judge, not a group with a threshold: the
    drain rules' no_quorum holds for a peer_lag straggler as for a score."""
    sim = state_sim(3, statistical_min=5, delay={2: 0.2})
    for _ in range(4):
        sim.interval()
    assert [e.node_id for e in sim.of("peer_lag")] == ["n2"]
    assert [e for e in sim.events if e.type == "straggler_state"] == []
    assert sim.tick is not None and sim.tick.verdicts == ()


def test_events_carry_the_fields_their_journald_catalog_entries_name() -> None:
    catalog = (ROOT / "systemd" / "catalog" / "ingero.catalog").read_text()
    sim = Sim(8, one_per_node(8), delay={2: 0.2}, config=NcclConfig(hang_after=2.0))
    for _ in range(3):
        sim.interval()
    sim.block_at, sim.stop_before = sim.seq + 5, {4: sim.seq + 5}
    while not sim.of("collective_hang"):
        sim.interval()
    sim.block_at, sim.stop_before, sim.delay = None, {}, {}
    for _ in range(3):
        sim.interval()
    for kind in ("peer_lag", "collective_hang"):
        (start,), (end,) = sim.of(kind), sim.of(kind, "end")
        entry = catalog.split(f"-- {MESSAGE_IDS[kind]}\n", 1)[1].split("\n-- ", 1)[0]
        named = set(re.findall(r"\b(INGERO_[A-Z0-9_]+)\b", entry))
        assert len(named) > 3, kind
        assert named <= start.journal_fields().keys() | end.journal_fields().keys(), kind


def test_pushes_are_not_held_up_by_a_tick_and_what_they_bring_is_kept() -> None:
    """A push filed while the tick joins (phase 2) neither waits for the tick's lock nor
    loses its calls: the next tick joins them."""
    sim = Sim(8, one_per_node(8), delay={1: 0.2})
    for _ in range(2):
        sim.interval()
    join = sim.join
    assert join is not None
    late_push = NodePush(
        node_id="n7",
        cluster_id="c1",
        score=0.9,
        job_id="1234",
        collectives=(
            CommReport(
                HASH,
                7,
                8,
                entered_seq=10_000,
                returned_seq=10_000,
                calls=(CollectiveCall(10_000, "ncclAllReduce", 1, 2, 8),),
            ),
        ),
    )
    filed: list[bool] = []
    original = join._judge_lag

    def during_tick(comm: object, now: float) -> list[Event]:
        worker = threading.Thread(target=lambda: (join.ingest(late_push, 0.0), filed.append(True)))
        worker.start()
        worker.join(timeout=10)
        return original(comm, now)  # type: ignore[arg-type]

    join._judge_lag = during_tick  # type: ignore[method-assign]
    sim.interval()
    join._judge_lag = original  # type: ignore[method-assign]
    assert filed == [True]
    (comm,) = join._comms.values()
    assert comm.pending[10_000] == {7: (1.0, 8, "ncclAllReduce")}


# ---- collective_wait ------------------------------------------------------------------


def block_next(sim: Sim, missing: dict[int, int] | None = None) -> int:
    """Every rank stops inside the next interval at one collective (returned at enqueue,
    then waiting in a stream sync); ``missing`` ranks stop that many collectives short."""
    sim.interval()
    block = sim.seq + 10  # half an interval into the next one
    sim.block_at = block
    sim.stop_before = {r: block + rel for r, rel in (missing or {}).items()}
    return block


def test_the_rank_its_peers_wait_for_is_named_long_before_a_hang() -> None:
    sim = Sim(8, one_per_node(8), asynchronous=True)  # wait_after 0.5 s, hang_after 30 s
    block = block_next(sim, {5: 0})
    ticks = 0
    while not sim.of("collective_wait"):
        result = sim.interval()
        ticks += 1
        assert ticks < 5
    # The others entered #block half an interval in; rank 5's report at that interval's
    # end, wait_after (0.5 s) later, shows it has not: named at that tick, the first after
    # their arrival.
    assert ticks == 1
    (wait,) = sim.of("collective_wait")
    assert wait.node_id == "n5" and wait.job_id == "1234"
    extra = wait.extra
    assert (extra["seq"], extra["op"], extra["comm_hash"]) == (block, "ncclAllReduce", HASH)
    assert (extra["missing_ranks"], extra["missing_nodes"]) == ([5], ["n5"])
    assert extra["waiting_ranks"] == [0, 1, 2, 3, 4, 6, 7] and extra["waiting_count"] == 7
    assert extra["reason"] == "missing_ranks" and extra["waiting_for_s"] >= 0.5
    assert sim.of("collective_hang") == []
    # Its node is named (its reply says so, as for a hang); the others wait for it.
    named = result.named[("c1", "n5")]
    assert (named.type, named.event_id, named.seq) == ("collective_wait", wait.event_id, block)
    assert sorted(result.waiting) == [("c1", f"n{r}") for r in range(8) if r != 5]
    said = result.waiting[("c1", "n0")]
    assert (said["ranks"], said["nodes"], said["seq"]) == ([5], ["n5"], block)
    assert said["event_id"] == wait.event_id and result.waits == 1
    # One event, not one a tick; ended once rank 5 arrives and the job goes on.
    sim.interval()
    assert len(sim.of("collective_wait")) == 1
    sim.block_at, sim.stop_before = None, {}
    result = sim.interval()
    (end,) = sim.of("collective_wait", "end")
    assert end.event_id == wait.event_id and end.extra["reason"] == "moved_on"
    assert result.waiting == {} and result.waits == 0


@pytest.mark.parametrize("delay", [0.2, 0.4])
def test_a_rank_that_is_late_but_arrives_is_not_waited_for(delay: float) -> None:
    """A rank late by less than nccl.wait_after into every collective is a peer lag, not a
    rank its peers are stopped for: its every report shows it has gone on."""
    sim = Sim(8, one_per_node(8), delay={5: delay}, asynchronous=True)
    for _ in range(8):
        result = sim.interval()
        assert result.waiting == {}
    assert sim.of("collective_wait") == []


def test_every_rank_stopped_at_one_collective_is_one_wait_that_names_no_rank() -> None:
    sim = Sim(8, one_per_node(8), asynchronous=True)
    sim.quiet = {f"n{r}" for r in range(8)}  # no node launches anything: they wait on it
    block = block_next(sim)
    for _ in range(3):
        result = sim.interval()
    (wait,) = sim.of("collective_wait")
    assert wait.node_id == "" and wait.extra["missing_ranks"] == []
    assert wait.extra["seq"] == block and wait.extra["waiting_count"] == 8
    assert wait.extra["reason"].startswith("all_ranks_waiting")
    assert result.named == {} and len(result.waiting) == 8
    assert result.waiting[("c1", "n3")]["ranks"] == []


def test_every_rank_past_a_collective_while_launching_is_not_a_wait() -> None:
    """Computing between collectives (an evaluation): every rank entered N and nothing
    since, but their nodes launch kernels. Nothing is said."""
    sim = Sim(8, one_per_node(8), asynchronous=True)
    block_next(sim)
    for _ in range(5):
        result = sim.interval()
    assert sim.of("collective_wait") == [] and result.waiting == {}


def test_the_wait_reaches_the_replies_and_no_rank_that_waits_is_a_straggler() -> None:
    sim = state_sim(8, asynchronous=True)
    block = block_next(sim, {5: 0})
    for _ in range(3):
        sim.interval()
    (wait,) = sim.of("collective_wait")
    reply = sim.replies["n2"].waiting_for
    assert reply is not None and (reply["ranks"], reply["nodes"]) == ([5], ["n5"])
    assert (reply["seq"], reply["event_id"]) == (block, wait.event_id)
    missing = sim.replies["n5"]
    assert missing.waiting_for is None
    assert (missing.nccl_episode_type, missing.nccl_episode_id) == (
        "collective_wait",
        wait.event_id,
    )
    assert sim.tick is not None and sim.tick.waiting_nodes == 7 and sim.tick.waiting_comms == 1
    assert [e for e in sim.events if e.type == "straggler_state"] == []


def test_a_lag_episode_restarts_with_the_figures_of_now_once_a_window_later() -> None:
    """The window a lag episode opens in still holds collectives from before the rank fell
    behind: its start says a smaller lag than the rank has. Once a whole window later the
    lag says otherwise, the start comes again (same id, ``repeat`` counts) with the figures
    of now, at most once a window; a steady lag is not repeated."""
    sim = Sim(8, one_per_node(8), delay={5: 0.05}, config=NcclConfig(window=20))
    for _ in range(4):
        sim.interval()
    (first,) = sim.of("peer_lag")
    assert first.extra["repeat"] == 0
    sim.delay = {5: 0.25}
    for _ in range(4):
        sim.interval()
    starts = sim.of("peer_lag")
    assert [e.extra["repeat"] for e in starts] == [0, 1]
    assert starts[1].event_id == first.event_id
    assert starts[1].extra["lag_p50_ms"] == pytest.approx(250, rel=0.2)
    for _ in range(4):
        sim.interval()
    assert len(sim.of("peer_lag")) == 2


class _LateNode(CollectiveJoin):
    """Each push of ``node`` reaches Fleet after that node's next one: a push that timed
    out at the node (its push timeout) but that Fleet received and answered late."""

    def __init__(self, config: NcclConfig, node: str) -> None:
        super().__init__(config, TTL)
        self.node = node
        self.late: NodePush | None = None

    def ingest(self, push: NodePush, mono: float, now: float | None = None) -> None:
        super().ingest(push, mono, now)
        if push.node_id == self.node:
            if self.late is not None:
                super().ingest(self.late, mono, now)
            self.late = push


def test_a_push_that_arrives_after_the_next_one_does_not_move_its_rank_back() -> None:
    """n2 waits at #block with the others for rank 5; each of its pushes arrives after its
    next one. The late one is an older view of n2: the wait names rank 5 alone on the
    same tick as when every push arrives in order, and the late pushes' calls still join."""
    sim = Sim(8, one_per_node(8), asynchronous=True)
    sim.join = late = _LateNode(sim.config, "n2")
    block = block_next(sim, {5: 0})
    result = sim.interval()
    assert late.late is not None  # n2's pushes were each delivered after its next one
    (wait,) = sim.of("collective_wait")
    assert (wait.extra["missing_ranks"], wait.extra["seq"]) == ([5], block)
    assert sorted(result.named) == [("c1", "n5")] and ("c1", "n2") in result.waiting
    lags = {lag.comm_rank: lag for lag in late.rank_lags("c1", "c1/job/1234", HASH)}
    assert lags[2].collectives == lags[0].collectives > 0


@pytest.mark.parametrize("reported", [True, False], ids=["offset measured", "unmeasured"])
def test_a_node_clock_stepped_back_is_taken_again(reported: bool) -> None:
    """n2's clock steps 10 s back: its reports look older than the one Fleet keeps. With
    the offset re-measured (as fleet-push does) they are not, on Fleet's clock; without
    it, they are taken again after half the node TTL, and a wait is still named in time."""
    sim = Sim(8, one_per_node(8), asynchronous=True)
    if not reported:
        sim.unreported = {"n2"}
    for _ in range(2):
        sim.interval()
    sim.skew["n2"] = 10.0  # n2 now reads Fleet's time by adding 10 s to its own
    block = block_next(sim, {5: 0})
    ticks = 1  # block_next ran one interval
    while not sim.of("collective_wait"):
        sim.interval()
        ticks += 1
        assert ticks < 8
    assert ticks <= (2 if reported else TTL / 2 / INTERVAL + 1)
    (wait,) = sim.of("collective_wait")
    assert (wait.extra["missing_ranks"], wait.extra["seq"]) == ([5], block)
