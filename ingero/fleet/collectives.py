"""Fleet joins the ranks of each NCCL communicator: who enters collectives late (``peer_lag``)
and who never entered the collective the others wait in (``collective_hang``). Pure: no I/O,
time from an injected clock.

Every node pushes, per (communicator, rank) it holds, a sample of its collectives' entry
times on its own clock and its clock offset to Fleet (:mod:`ingero.otlp.collectives`).
:meth:`CollectiveJoin.ingest` (receiver threads, O(calls)) files them; :meth:`tick` (the
tick thread, once per push interval) does the work:

- **join**: a sequence number is joined once enough ranks reported it (every rank of a
  communicator of at most :data:`SMALL_COMM` ranks, else ``nccl.join_fraction`` of them) and
  every other live rank either reported it too or has already passed it (so a late rank's
  push is waited for), or two ticks after it had that quorum (a rank that never arrives).
  Entry times are put on Fleet's clock (node time + the node's offset; a node with no
  offset counts as 0 and its ranks say so). Per joined collective: each rank's lag behind
  the median entry, and which rank was last.
- **peer_lag**: over the last ``nccl.window`` joined collectives, a rank is late in one
  when its lag exceeds ``max(k·1.4826·MAD, nccl.min_lag)`` of that collective's lags (the
  score's robust rule, so a few stragglers cannot drag the bar up to themselves). Late in
  more than ``nccl.lag_fraction`` of the window opens an episode (event ``peer_lag``,
  ``state: start``); late in fewer than half that share closes it (same ``event_id``,
  ``state: end``). While a communicator's window fills (a job's first steps), the share is
  of the collectives joined so far, a quarter window of them at least. The node's flagged lag goes to its push replies (``X-Ingero-Peer-Lag``)
  and counts in Fleet's straggler classification.
- **collective_hang**: ranks that entered the communicator's highest collective N and
  nothing since, for more than ``nccl.hang_after``, while some rank's last entered
  collective is below N: one event per (communicator, N) naming those ranks (the
  wavefront). Real NCCL returns from the call once the collective is enqueued, so the
  waiting ranks have returned from N and wait in a stream sync; a stand-in or blocking
  call keeps them inside it. When every rank is still *inside the call* to N, the event
  names none (the fabric, not a rank); every rank past N's call and none further is not
  judged (computing and waiting look alike from here). ``state: end`` once the
  communicator moves on or the missing ranks arrive.

This module joins, judges lag and runs the tick; the hang and wait judging is
:mod:`ingero.fleet.collective_stops`, and the per-communicator records both read and write
are :mod:`ingero.fleet.communicator`.

Memory is bounded by configuration: ``nccl.max_comms`` communicators in all and
``nccl.max_comms_per_group`` per peer group (new ones beyond are refused and counted),
``nccl.max_pending`` unjoined sequence numbers and ``nccl.window`` joined rows per
communicator; a rank is forgotten after the node TTL without a report of it, a
communicator with no rank left is dropped (its open episodes end with ``reason: expired``).
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np

from ingero.fleet.collective_stops import hang_end, judge_hang, judge_wait, name_wait, wait_event
from ingero.fleet.communicator import (
    DETECTION_MODE,
    Comm,
    CommKey,
    JoinedRow,
    LagEpisode,
    NcclNamed,
    RankState,
)
from ingero.fleet.config import NcclConfig
from ingero.fleet.model import NodeKey, PeerLagCause
from ingero.fleet.threshold import MAD_SCALE, FloatArray, IntArray
from ingero.otlp.build import build
from ingero.otlp.collectives import CommReport
from ingero.otlp.health import NodePush
from ingero.schema.events import Event, new_event_id

# Communicators this small (an 8-GPU node's ranks, a few nodes) are joined only when every
# rank reported the collective: one missing rank is a large share of their median.
SMALL_COMM = 8
# Ticks a joinable collective waits for the ranks that have not reported it yet.
_JOIN_WAIT_TICKS = 2


@dataclass(frozen=True)
class RankLag:
    """One rank's figures over the communicator's last window of joined collectives."""

    comm_rank: int
    node_id: str
    collectives: int
    late: int
    last_count: int
    lag_p50_s: float
    lag_p95_s: float
    wait_p50_s: float = 0.0  # its median barrier wait: how long it waits for the last rank


@dataclass(frozen=True)
class NcclTick:
    """What one tick decided: events, the flagged lag per node (s) and figures for metrics."""

    events: tuple[Event, ...]
    peer_lag: dict[NodeKey, float]  # lag (s) of the node's most lagging flagged rank
    lagging_groups: dict[NodeKey, str]  # the peer group its flagged rank's comm is in
    comms: int
    hung: int
    joined: int
    refused: int
    # the flagged rank behind a node's ``peer_lag`` (what a drain reason names)
    causes: dict[NodeKey, PeerLagCause] = field(default_factory=dict)
    # per node: the open episode that names one of its ranks, a hang before a wait before a lag
    named: dict[NodeKey, NcclNamed] = field(default_factory=dict)
    # per node whose rank waits at a collective for others (or with every rank stopped at
    # it): what its push replies say (ingero.otlp.threshold, ``waiting_for``)
    waiting: dict[NodeKey, dict[str, object]] = field(default_factory=dict)
    waits: int = 0  # communicators stopped at a collective (open collective_wait episodes)


def _required(nranks: int, fraction: float) -> int:
    if nranks <= SMALL_COMM:
        return nranks
    return max(SMALL_COMM, math.ceil(fraction * nranks))


class CollectiveJoin:
    """The communicators of every peer group, joined per tick (see the module docstring)."""

    def __init__(self, config: NcclConfig, node_ttl: float) -> None:
        self._cfg = config
        self._ttl = node_ttl
        self._lock = threading.Lock()  # ingest's and the tick's shared state
        self._tick_lock = threading.Lock()  # ticks are serialised; rows are the tick's
        self._comms: dict[CommKey, Comm] = {}
        self._per_group: Counter[str] = Counter()
        self._ticks = 0
        self._refused = 0
        # (offset s, uncertainty s) of a node, from its last push that had one.
        self._clocks: dict[NodeKey, tuple[float, float]] = {}
        self._clock_seen: dict[NodeKey, float] = {}

    # ---- receivers ------------------------------------------------------------------

    def ingest(self, push: NodePush, mono: float, now: float | None = None) -> None:
        """File one accepted push's communicators and clock offset (receiver threads);
        ``now``: Fleet's Unix time of its arrival (None: the reports' own times only)."""
        if not push.collectives and push.clock is None:
            return
        clock = push.clock
        offset_ns = round(clock.offset_s * 1e9) if clock is not None else 0
        # Without the arrival time a report without its own time is as of nothing known.
        arrived = now if now is not None else -math.inf
        group = push.group
        with self._lock:
            if clock is not None:
                node = (push.cluster_id, push.node_id)
                self._clocks[node] = (clock.offset_s, clock.uncertainty_s)
                self._clock_seen[node] = mono
            for report in push.collectives:
                comm = self._comm(push, group, report)
                if comm is None:
                    continue
                # A push that reached Fleet after the node's next one (it timed out at the
                # node, Fleet answered late) is an older view of the rank: it would move the
                # rank back behind a collective it has entered, and its peers' wait would
                # name it. Its calls still join; its state is past. Compared on Fleet's
                # clock, so a node clock stepped back with its offset re-measured is not
                # older; one stepped back unmeasured is taken again after half the TTL.
                as_of = (report.as_of_ns + offset_ns) / 1e9 if report.as_of_ns else arrived
                had = comm.ranks.get(report.comm_rank)
                if not (
                    had is not None
                    and had.node_id == push.node_id
                    and as_of < had.as_of
                    and mono - had.seen < self._ttl / 2
                ):
                    comm.ranks[report.comm_rank] = RankState(
                        node_id=push.node_id,
                        slurm_rank=push.rank,
                        report=build(CommReport, **{**report.__dict__, "calls": ()}),
                        offset_ns=offset_ns,
                        offset_known=clock is not None,
                        seen=mono,
                        ops=tuple([(c[0], c[1], c[2] + offset_ns) for c in report.calls]),
                        as_of=as_of,
                        quiet=push.quiet,
                    )
                # Up to 1,024 calls a push: what the loop reads is in locals.
                joined, pending, rank = comm.joined_seq, comm.pending, report.comm_rank
                for seq, op, entered_ns, _, size in report.calls:
                    if seq <= joined:
                        continue  # already joined without it: too late to count
                    entries = pending.get(seq)
                    if entries is None:
                        if len(pending) >= self._cfg.max_pending:
                            oldest = min(pending)
                            if seq < oldest:
                                continue
                            del pending[oldest]
                        entries = pending[seq] = {}
                    entries[rank] = (float(entered_ns + offset_ns), size, op)

    def _comm(self, push: NodePush, group: str, report: CommReport) -> Comm | None:
        key = (push.cluster_id, group, report.comm_hash)
        comm = self._comms.get(key)
        if comm is not None:
            if report.nranks != comm.nranks or report.comm_rank >= comm.nranks:
                self._refused += 1  # a hash collision or a confused node: keep the first view
                return None
            return comm
        if (
            len(self._comms) >= self._cfg.max_comms
            or self._per_group[group] >= self._cfg.max_comms_per_group
        ):
            self._refused += 1
            return None
        comm = Comm(
            cluster_id=push.cluster_id,
            group=group,
            job_id=push.job_id or None,
            comm_hash=report.comm_hash,
            nranks=report.nranks,
        )
        comm.rows = deque(maxlen=self._cfg.window)
        self._comms[key] = comm
        self._per_group[group] += 1
        return comm

    # ---- reads ----------------------------------------------------------------------

    def clock_offsets(self) -> list[tuple[str, str, float, float]]:
        """(cluster_id, node_id, offset s, uncertainty s) of every node that sent one."""
        with self._lock:
            return [(c, node, off, unc) for (c, node), (off, unc) in self._clocks.items()]

    def rank_lags(self, cluster_id: str, group: str, comm_hash: str) -> list[RankLag]:
        """Every rank's figures over the communicator's window (for tests and tools)."""
        with self._tick_lock, self._lock:
            comm = self._comms.get((cluster_id, group, comm_hash))
            return [] if comm is None else _rank_lags(comm, self._cfg)

    # ---- tick -----------------------------------------------------------------------

    def tick(self, now: float, mono: float) -> NcclTick:
        """Expire, join, judge lag and hangs; ``now`` is Fleet's Unix time (s).

        Three phases, so pushes are not held up by the join: under the lock, expire and
        take each communicator's unjoined calls and a copy of its ranks; without it, join
        and judge (only ticks touch the rows, episodes and hangs; ticks are serialised);
        under it again, hand back what was not joined, merged with what came meanwhile.
        """
        events: list[Event] = []
        peer_lag: dict[NodeKey, float] = {}
        groups: dict[NodeKey, str] = {}
        causes: dict[NodeKey, PeerLagCause] = {}
        named: dict[NodeKey, NcclNamed] = {}
        waiting: dict[NodeKey, dict[str, object]] = {}
        joined = hung = waits = 0
        with self._tick_lock:
            with self._lock:
                self._ticks += 1
                events.extend(self._expire(now, mono))
                work = []
                for comm in self._comms.values():
                    comm.view = dict(comm.ranks)
                    work.append((comm, comm.pending))
                    comm.pending = {}
            done = []
            for comm, pending in work:
                joined += self._join(comm, pending)
                events.extend(self._judge_lag(comm, now))
                events.extend(judge_hang(comm, self._cfg, now))
                events.extend(judge_wait(comm, self._cfg, now))
                hung += comm.hang is not None
                waits += comm.wait is not None
                for rank, episode in comm.lagging.items():
                    node = (comm.cluster_id, episode.node_id)
                    if episode.lag_s > peer_lag.get(node, -1.0):
                        peer_lag[node] = episode.lag_s
                        groups[node] = comm.group
                        causes[node] = PeerLagCause(comm.comm_hash, rank, episode.lag_s)
                    if node not in named:
                        op = _window_op_bytes(comm)[0] or None
                        named[node] = NcclNamed("peer_lag", episode.event_id, episode.since, op)
                if comm.wait is not None:  # before the hang's bound: who holds the job back
                    name_wait(comm, named, waiting)
                if comm.hang is not None:  # the ranks the others wait for: a hang comes first
                    hang = comm.hang
                    # Those below the hung collective now: a rank that had not reported yet
                    # when the hang began is named once it has (and only if it is behind).
                    for st in comm.view.values():
                        if st.report.entered_seq < hang.seq:
                            node = (comm.cluster_id, st.node_id)
                            named[node] = NcclNamed(
                                "collective_hang", hang.event_id, hang.since, hang.op, hang.seq
                            )
                done.append((comm, pending))
            with self._lock:
                for comm, leftover in done:
                    self._merge(comm, leftover)
                comms, refused = len(self._comms), self._refused
        return NcclTick(
            events=tuple(events),
            peer_lag=peer_lag,
            lagging_groups=groups,
            comms=comms,
            hung=hung,
            joined=joined,
            refused=refused,
            causes=causes,
            named=named,
            waiting={node: w for node, w in waiting.items() if node not in named},
            waits=waits,
        )

    def _expire(self, now: float, mono: float) -> list[Event]:
        """Forget what the node TTL passed: clock offsets, ranks, empty communicators."""
        events: list[Event] = []
        for node in [n for n, s in self._clock_seen.items() if mono - s >= self._ttl]:
            del self._clock_seen[node]
            del self._clocks[node]
        for key, comm in list(self._comms.items()):
            for rank in [r for r, st in comm.ranks.items() if mono - st.seen >= self._ttl]:
                del comm.ranks[rank]
            if not comm.ranks:
                events.extend(_end_all(comm, now, "expired"))
                del self._comms[key]
                self._per_group[comm.group] -= 1
                if not self._per_group[comm.group]:
                    del self._per_group[comm.group]
        return events

    def _merge(self, comm: Comm, leftover: dict[int, dict[int, tuple[float, int, str]]]) -> None:
        """Give back the calls the tick did not join, with those ingested meanwhile."""
        arrived, comm.pending = comm.pending, leftover
        for seq, entries in arrived.items():
            if seq > comm.joined_seq:
                comm.pending.setdefault(seq, {}).update(entries)
        for seq in sorted(comm.pending)[: max(0, len(comm.pending) - self._cfg.max_pending)]:
            del comm.pending[seq]
        # The tick's own bookkeeping (only ticks touch it): for what still waits.
        comm.quorum_tick = {s: t for s, t in comm.quorum_tick.items() if s in comm.pending}

    def _join(self, comm: Comm, pending: dict[int, dict[int, tuple[float, int, str]]]) -> int:
        """Join every collective that is ready (module docstring); returns how many."""
        need = _required(comm.nranks, self._cfg.join_fraction)
        entered = sorted(st.report.entered_seq for st in comm.view.values())
        ready: list[int] = []
        for seq in sorted(pending):
            entries = pending[seq]
            if len(entries) < need:
                continue
            # Only ranks that have not passed seq may still report it: usually none.
            waiting = bisect.bisect_left(entered, seq) > 0 and any(
                rank not in entries and st.report.entered_seq < seq
                for rank, st in comm.view.items()
            )
            first = comm.quorum_tick.setdefault(seq, self._ticks)
            if not waiting or self._ticks - first >= _JOIN_WAIT_TICKS:
                ready.append(seq)
        if not ready:
            return 0
        top = ready[-1]
        joined = set(ready)
        batch: list[tuple[int, dict[int, tuple[float, int, str]]]] = []
        # Everything at or below the newest joined collective is settled: joined now, or
        # never to reach quorum (ranks that sample other sequence numbers).
        for seq in sorted(s for s in pending if s <= top):
            entries = pending.pop(seq)
            comm.quorum_tick.pop(seq, None)
            if seq in joined:
                batch.append((seq, entries))
        comm.rows.extend(self._rows(batch))
        comm.joined_seq = top
        comm.joined_total += len(ready)
        return len(ready)

    def _rows(self, batch: list[tuple[int, dict[int, tuple[float, int, str]]]]) -> list[JoinedRow]:
        """The joined collectives of one tick, computed as one matrix (collective x rank,
        NaN where a rank did not report it): medians, lags, MADs and the last rank."""
        if not batch:
            return []
        ranks = np.unique(np.fromiter((r for _, e in batch for r in e), dtype=np.int64))
        column = {int(r): i for i, r in enumerate(ranks.tolist())}
        entry = np.full((len(batch), ranks.size), np.nan)
        for row, (_, entries) in enumerate(batch):
            for rank, (at, _size, _op) in entries.items():
                entry[row, column[rank]] = at
        present = ~np.isnan(entry)
        median = _row_median(entry)
        lag = entry - median[:, None]
        mad = _row_median(np.abs(lag))  # the lags' median is 0 by construction
        bar = np.maximum(self._cfg.k * MAD_SCALE * mad, float(self._cfg.min_lag) * 1e9)
        late = np.where(present, lag, -np.inf) > bar[:, None]
        last_entry = np.max(np.where(present, entry, -np.inf), axis=1)
        wait = last_entry[:, None] - entry
        last = ranks[np.argmax(np.where(present, entry, -np.inf), axis=1)].tolist()
        rows = []
        for row, (seq, entries) in enumerate(batch):
            mine = present[row]
            sizes = sorted(e[1] for e in entries.values())
            rows.append(
                JoinedRow(
                    seq=seq,
                    op=Counter(e[2] for e in entries.values()).most_common(1)[0][0],
                    bytes=sizes[len(sizes) // 2],
                    ranks=ranks[mine],
                    lag_ns=lag[row, mine],
                    wait_ns=wait[row, mine],
                    late=late[row, mine],
                    last_rank=last[row],
                )
            )
        return rows

    def _judge_lag(self, comm: Comm, now: float) -> list[Event]:
        events: list[Event] = []
        window = self._cfg.window
        # The share is of the window's joined collectives, a quarter of a window of them at
        # least: while a new communicator's window fills (a job's first steps: 20 are 2.5
        # steps of 1 s at 8 collectives a step), a rank late in most of its first ones is
        # judged on them, not held until it was late in more than half a full window.
        enter_at = self._cfg.lag_fraction * max(len(comm.rows), _min_judged(window))
        figures = {r.comm_rank: r for r in _rank_lags(comm, self._cfg)}
        for rank, fig in figures.items():
            episode = comm.lagging.get(rank)
            st = comm.view.get(rank)
            if episode is None and fig.late > enter_at and st is not None:
                episode = LagEpisode(new_event_id(), now, st.node_id, st.slurm_rank, 0.0)
                comm.lagging[rank] = episode
                episode.lag_s = fig.lag_p50_s
                events.append(self._lag_start(comm, rank, figures, episode, now, st))
            elif episode is not None:
                episode.lag_s = fig.lag_p50_s
                if fig.late < enter_at / 2:
                    del comm.lagging[rank]
                    events.append(_lag_event(comm, rank, fig, episode, now, "end", "recovered", st))
                elif (
                    st is not None
                    and comm.joined_total - episode.said_at >= window
                    and abs(fig.lag_p50_s - episode.said_lag_s) > 0.2 * episode.said_lag_s
                ):
                    # The window it opened in held on-time collectives too: once a whole
                    # window later its lag says otherwise, a start again with the figures
                    # of now (Echo keeps the newest start's), at most once a window.
                    episode.repeats += 1
                    events.append(self._lag_start(comm, rank, figures, episode, now, st))
        for rank in [r for r in comm.lagging if r not in comm.view]:
            episode = comm.lagging.pop(rank)
            events.append(_lag_end(comm, rank, episode, now, "expired"))
        return events

    def _lag_start(
        self,
        comm: Comm,
        rank: int,
        figures: dict[int, RankLag],
        episode: LagEpisode,
        now: float,
        st: RankState,
    ) -> Event:
        """A lag episode's start event (or a re-emit of it, ``repeat`` > 0)."""
        fig = figures[rank]
        others = [f.wait_p50_s for r, f in figures.items() if r != rank]
        wait = sorted(others)[len(others) // 2] if others else 0.0
        episode.said_lag_s, episode.said_at = fig.lag_p50_s, comm.joined_total
        event = _lag_event(comm, rank, fig, episode, now, "start", None, st, wait)
        event.extra["repeat"] = episode.repeats
        return event


def _min_judged(window: int) -> int:
    """The fewest joined collectives a rank's lateness is judged over (a quarter window, 2
    at least): below it, the share of a window that opens a lag episode is of this many."""
    return max(2, window // 4)


def _rank_lags(comm: Comm, cfg: NcclConfig) -> list[RankLag]:
    """Per rank present in the window: collectives counted, late, last, lag p50/p95."""
    rows = list(comm.rows)
    if not rows:
        return []
    ranks = np.unique(np.concatenate([r.ranks for r in rows]))
    lag = np.full((len(rows), ranks.size), np.nan)
    wait = np.full((len(rows), ranks.size), np.nan)
    late = np.zeros(ranks.size, dtype=np.int64)
    for i, row in enumerate(rows):
        cols = np.searchsorted(ranks, row.ranks)
        lag[i, cols] = row.lag_ns
        wait[i, cols] = row.wait_ns
        late[cols] += row.late
    counts = (~np.isnan(lag)).sum(axis=0)
    ordered = np.sort(lag, axis=0)  # NaN sort last
    p50, p95 = _column_quantile(ordered, counts, 0.5), _column_quantile(ordered, counts, 0.95)
    waits = _column_quantile(np.sort(wait, axis=0), counts, 0.5)
    last = Counter(r.last_rank for r in rows)
    out: list[RankLag] = []
    for i, rank in enumerate(ranks.tolist()):
        st = comm.view.get(rank)
        out.append(
            RankLag(
                comm_rank=rank,
                node_id=st.node_id if st else "",
                collectives=int(counts[i]),
                late=int(late[i]),
                last_count=last.get(rank, 0),
                lag_p50_s=float(p50[i]) / 1e9,
                lag_p95_s=float(p95[i]) / 1e9,
                wait_p50_s=float(waits[i]) / 1e9,
            )
        )
    return out


def _row_median(values: FloatArray) -> FloatArray:
    """Each row's median over its non-NaN values (every row has one), as np.median."""
    counts = (~np.isnan(values)).sum(axis=1)
    ordered = np.sort(values, axis=1)  # NaN sort last
    rows = np.arange(values.shape[0])
    lo, hi = ordered[rows, (counts - 1) // 2], ordered[rows, counts // 2]
    median: FloatArray = (lo + hi) / 2.0
    return median


def _column_quantile(ordered: FloatArray, counts: IntArray, q: float) -> FloatArray:
    """The q-quantile of each column of NaN-last sorted values with ``counts`` values each,
    interpolated linearly between neighbours as np.percentile does by default."""
    pos = q * (np.maximum(counts, 1) - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.ceil(pos).astype(np.int64)
    cols = np.arange(ordered.shape[1])
    a, b = ordered[lo, cols], ordered[hi, cols]
    value: FloatArray = a + (b - a) * (pos - lo)
    return value


def _window_op_bytes(comm: Comm) -> tuple[str, int]:
    rows = comm.rows
    if not rows:
        return "", 0
    op = Counter(r.op for r in rows).most_common(1)[0][0]
    sizes = sorted(r.bytes for r in rows)
    return op, sizes[len(sizes) // 2]


def _lag_event(
    comm: Comm,
    rank: int,
    fig: RankLag,
    episode: LagEpisode,
    now: float,
    state: str,
    reason: str | None,
    st: RankState | None,
    peers_wait_s: float = 0.0,
) -> Event:
    op, size = _window_op_bytes(comm)
    extra: dict[str, object] = {
        # How long the other ranks wait for this one at the barrier (median of theirs).
        "peers_wait_p50_ms": round(peers_wait_s * 1e3, 3),
        "state": state,
        "group": comm.group,
        "comm_hash": comm.comm_hash,
        "comm_rank": rank,
        "nranks": comm.nranks,
        "op": op,
        "seq": comm.joined_seq,
        "lag_p50_ms": round(fig.lag_p50_s * 1e3, 3),
        "lag_p95_ms": round(fig.lag_p95_s * 1e3, 3),
        "collectives": fig.collectives,
        "late_count": fig.late,
        "last_count": fig.last_count,
        "bytes": size,
        # Entry times are on Fleet's clock only where the node measured its offset.
        "clock_offset_known": bool(st.offset_known) if st else False,
    }
    if state == "end":
        extra.update(reason=reason, since=episode.since, duration_s=now - episode.since)
    return Event(
        type="peer_lag",
        node_id=episode.node_id,
        cluster_id=comm.cluster_id,
        timestamp=now,
        event_id=episode.event_id,
        job_id=comm.job_id,
        rank=episode.slurm_rank,
        detection_mode=DETECTION_MODE,
        dominant_signal="peer_lag",
        extra=extra,
    )


def _lag_end(comm: Comm, rank: int, episode: LagEpisode, now: float, reason: str) -> Event:
    fig = RankLag(rank, episode.node_id, 0, 0, 0, episode.lag_s, episode.lag_s)
    return _lag_event(comm, rank, fig, episode, now, "end", reason, None)


def _end_all(comm: Comm, now: float, reason: str) -> list[Event]:
    events = [_lag_end(comm, r, ep, now, reason) for r, ep in comm.lagging.items()]
    comm.lagging.clear()
    if comm.hang is not None:
        events.append(hang_end(comm, comm.hang, now, reason))
        comm.hang = None
    if comm.wait is not None:
        events.append(wait_event(comm, comm.wait, now, "end", reason=reason))
        comm.wait = None
    return events
