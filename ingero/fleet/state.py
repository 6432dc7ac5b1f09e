"""Fleet's in-memory score map and its tick: pure state, driven by an injected clock.

The daemon calls :meth:`FleetState.ingest` from many receiver threads (O(1): it stores the
node's latest score and returns the threshold computed at the last tick) and
:meth:`FleetState.tick` once per push interval. Scores live in flat numpy columns indexed
by a slot per node, so a tick is a handful of vectorised passes over all nodes.

A tick works in three phases so that pushes are never blocked by the sorts: under the lock
it expires silent nodes and copies the columns (``_snapshot``); without the lock it computes
the group statistics, classifies nodes and builds the group summaries (``_compute``,
``_summaries``, pure); under the lock again it stores the new per-node state, builds events
and verdicts and publishes the views. Only ticks free slots and groups (ticks are
serialised), so the slots copied in phase one still belong to the same nodes in phase three.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np

from ingero.clock import Clock
from ingero.events import Event, new_event_id
from ingero.fleet import threshold as th
from ingero.fleet.config import FleetConfig
from ingero.fleet.model import (
    NODE_STATES,
    CapacityError,
    ClusterStats,
    GroupStats,
    NodePush,
    NodeVerdict,
    ThresholdView,
    TickResult,
    group_key,
)
from ingero.fleet.threshold import BoolArray, FloatArray, IntArray

_INITIAL_CAPACITY = 1024
DETECTION_MODE = "fleet"


def validate_push(push: NodePush) -> float:
    """The push's score as a float; ValueError naming the field when the push is unusable."""
    if not isinstance(push.node_id, str) or not push.node_id:
        raise ValueError("push has no node id")
    if not isinstance(push.cluster_id, str) or not push.cluster_id:
        raise ValueError(f"push from {push.node_id} has no cluster id")
    score = push.score
    if isinstance(score, bool) or not isinstance(score, int | float):
        raise ValueError(f"push from {push.node_id}: score must be a number, got {score!r}")
    if not math.isfinite(score) or not 0.0 <= score <= 1.0:
        raise ValueError(f"push from {push.node_id}: score must be within [0, 1], got {score!r}")
    if push.state not in NODE_STATES:
        raise ValueError(f"push from {push.node_id}: unknown node state {push.state!r}")
    if push.rank is not None and (isinstance(push.rank, bool) or not isinstance(push.rank, int)):
        raise ValueError(f"push from {push.node_id}: rank must be an integer, got {push.rank!r}")
    return float(score)


class NodeScore(NamedTuple):
    """One active or idle node's latest push, as :meth:`FleetState.scores_snapshot` copies it."""

    node_id: str
    cluster_id: str
    group: str
    job_id: str | None
    workload_type: str | None
    rank: int | None
    score: float
    state: Literal["active", "idle"]
    dominant_signal: str | None
    seen: float  # the clock's monotonic reading at the node's last push
    host_name: str | None
    gpu_model: str | None
    gpu_count: int | None
    provider: str | None


# What Echo keeps about a node's hardware, from its last push (host, GPU model/count, provider).
_Meta = tuple[str | None, str | None, int | None, str | None]


@dataclass
class _Closing:
    """What an episode-ending event needs about a node (captured before its slot is freed)."""

    node_id: str
    cluster_id: str
    group: str
    job_id: str | None
    rank: int | None
    score: float
    event_id: str
    since: float
    dominant_signal: str | None
    threshold: float | None
    panic: bool


@dataclass
class _Snapshot:
    """Phase 1's copies: per tracked node (``idx`` are their slots) and per group index."""

    now: float
    expired: list[_Closing]
    expired_ids: list[str]
    idx: IntArray
    live_groups: IntArray
    scores: FloatArray
    gids: IntArray
    active: BoolArray
    idle: BoolArray
    was: BoolArray
    consec: IntArray
    since: FloatArray
    episode_gids: IntArray
    prev_ema: FloatArray
    prev_panic: BoolArray
    gkeys: list[str]
    gcluster: list[str]
    gjob: list[str | None]
    gworkload: list[str | None]


@dataclass
class _Outcome:
    """Phase 2's results: per group index, then per node of the snapshot."""

    figs: th.GroupFigures
    raw: FloatArray
    ema: FloatArray
    threshold: FloatArray
    quorum: BoolArray
    panic: BoolArray
    n_active: IntArray
    n_idle: IntArray
    n_tracked: IntArray
    n_below: IntArray
    n_straggler: IntArray
    straggler: BoolArray
    entering: BoolArray
    leaving: BoolArray
    consec: IntArray
    since: FloatArray


class FleetState:
    """Latest score of every node, per-group thresholds and per-node straggler episodes."""

    def __init__(self, config: FleetConfig, clock: Clock) -> None:
        self._config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._tick_lock = threading.Lock()
        self._max_nodes = config.limits.max_nodes
        # Nodes: slot per node id; numpy columns for what the tick computes on.
        self._slot_of: dict[str, int] = {}
        self._free_slots: list[int] = []
        self._n = 0  # slots in use are below this mark
        cap = _INITIAL_CAPACITY
        self._occupied = np.zeros(cap, dtype=np.bool_)
        self._score = np.zeros(cap)
        self._gid = np.zeros(cap, dtype=np.int64)
        self._active = np.zeros(cap, dtype=np.bool_)
        self._idle = np.zeros(cap, dtype=np.bool_)
        self._seen = np.zeros(cap)
        self._straggler = np.zeros(cap, dtype=np.bool_)
        self._consec = np.zeros(cap, dtype=np.int64)
        self._since = np.full(cap, np.nan)
        self._episode_gid = np.full(cap, -1, dtype=np.int64)
        self._node_id: list[str] = [""] * cap
        self._rank: list[int | None] = [None] * cap
        self._signal: list[str | None] = [None] * cap
        self._episode_id: list[str] = [""] * cap
        self._meta: list[_Meta | None] = [None] * cap
        # Groups: an index per group key, with its metadata and smoothed threshold.
        self._gid_of: dict[str, int] = {}
        self._free_gids: list[int] = []
        self._gn = 0
        gcap = _INITIAL_CAPACITY
        self._gkey: list[str] = [""] * gcap
        self._gcluster: list[str] = [""] * gcap
        self._gjob: list[str | None] = [None] * gcap
        self._gworkload: list[str | None] = [None] * gcap
        self._ema = np.full(gcap, np.nan)
        self._panic = np.zeros(gcap, dtype=np.bool_)
        # Published by the last tick.
        self._views: dict[str, ThresholdView] = {}
        self._groups: tuple[GroupStats, ...] = ()
        self._clusters: tuple[ClusterStats, ...] = ()
        self._last: TickResult | None = None

    # ---- hot path -------------------------------------------------------------------

    def ingest(self, push: NodePush) -> ThresholdView:
        """Store a node's latest push; return its group's threshold as of the last tick.

        Raises ValueError for an unusable push (the map is left untouched) and
        CapacityError for a new node when ``limits.max_nodes`` are already tracked.
        """
        score = validate_push(push)
        key = push.group
        with self._lock:
            slot = self._slot_of.get(push.node_id)
            gid = self._gid_of.get(key)
            if slot is None and len(self._slot_of) >= self._max_nodes:
                raise CapacityError(
                    f"fleet tracks {self._max_nodes} nodes (limits.max_nodes); "
                    f"refusing new node {push.node_id}"
                )
            if gid is None and len(self._gid_of) >= 2 * self._max_nodes:
                raise CapacityError(f"too many peer groups; refusing group {key}")
            if slot is None:
                slot = self._new_slot(push.node_id)
            if gid is None:
                gid = self._new_group(key, push)
            self._score[slot] = score
            self._gid[slot] = gid
            self._active[slot] = push.state == "active"
            self._idle[slot] = push.state == "idle"
            self._seen[slot] = self._clock.monotonic()
            self._rank[slot] = push.rank
            self._signal[slot] = push.dominant_signal
            self._meta[slot] = (push.host_name, push.gpu_model, push.gpu_count, push.provider)
            view = self._views.get(key)
        if view is None:
            return _empty_view(push.cluster_id, key)
        return view

    # ---- reads ----------------------------------------------------------------------

    def threshold_view(
        self, cluster_id: str, job_id: str | None = None, workload_type: str | None = None
    ) -> ThresholdView | None:
        """The group's view as of the last tick, or None when the group is unknown."""
        with self._lock:
            return self._views.get(group_key(cluster_id, job_id, workload_type))

    def node_count(self) -> int:
        with self._lock:
            return len(self._slot_of)

    def group_count(self) -> int:
        with self._lock:
            return len(self._gid_of)

    def groups_snapshot(self) -> tuple[GroupStats, ...]:
        """Every group as of the last tick (for /metrics)."""
        with self._lock:
            return self._groups

    def clusters_snapshot(self) -> tuple[ClusterStats, ...]:
        with self._lock:
            return self._clusters

    def last_tick(self) -> TickResult | None:
        with self._lock:
            return self._last

    def scores_snapshot(
        self, lowest: int | None = None, first: Collection[str] = ()
    ) -> list[NodeScore]:
        """Every active or idle node's latest push (for Echo's score history).

        With ``lowest``: at most that many nodes, those named in ``first`` (by node id)
        before the lowest scores (Fleet's per-node series); a partition, so only the rows
        kept are built however many nodes there are.

        Only column copies are taken under the lock, so pushes wait a few milliseconds even
        with 100,000 nodes; the rows are built after it is released.
        """
        with self._lock:
            n = self._n
            live = self._occupied[:n] & (self._active[:n] | self._idle[:n])
            idx = np.flatnonzero(live)
            if lowest is not None and len(idx) > lowest:
                rank = self._score[idx]
                named = [s for node in first if (s := self._slot_of.get(node)) is not None]
                rank[np.isin(idx, named)] = -np.inf
                idx = idx[np.argpartition(rank, lowest - 1)[:lowest]]
            scores, gids, active, seen = (
                self._score[idx],
                self._gid[idx],
                self._active[idx],
                self._seen[idx],
            )
            node_ids, ranks, signals, metas = (
                self._node_id[:n],
                self._rank[:n],
                self._signal[:n],
                self._meta[:n],
            )
            gn = self._gn
            gkeys, gclusters = self._gkey[:gn], self._gcluster[:gn]
            gjobs, gworkloads = self._gjob[:gn], self._gworkload[:gn]
        rows: list[NodeScore] = []
        for slot, score, gid, is_active, mono in zip(
            idx.tolist(),
            scores.tolist(),
            gids.tolist(),
            active.tolist(),
            seen.tolist(),
            strict=True,
        ):
            host, model, gpus, provider = metas[slot] or (None, None, None, None)
            rows.append(
                NodeScore(
                    node_id=node_ids[slot],
                    cluster_id=gclusters[gid],
                    group=gkeys[gid],
                    job_id=gjobs[gid],
                    workload_type=gworkloads[gid],
                    rank=ranks[slot],
                    score=score,
                    state="active" if is_active else "idle",
                    dominant_signal=signals[slot],
                    seen=mono,
                    host_name=host,
                    gpu_model=model,
                    gpu_count=gpus,
                    provider=provider,
                )
            )
        return rows

    # ---- tick -----------------------------------------------------------------------

    def tick(self) -> TickResult:
        """Expire silent nodes, recompute every group and classify every active node."""
        with self._tick_lock:
            return self._tick()

    def _tick(self) -> TickResult:
        with self._lock:
            snap = self._snapshot()
        out = _compute(snap, self._config)
        groups, clusters, views = _summaries(snap, out, self._config)
        with self._lock:
            self._store(snap, out)
            events = [_resolved_event(c, snap.now, "expired") for c in snap.expired]
            events.extend(self._closing_events(snap, out))
            events.extend(_degraded_events(snap, out))
            verdicts, started = self._open_episodes(snap, out)
            events.extend(started)
            self._views = views
            self._groups = groups
            self._clusters = clusters
            self._last = TickResult(
                computed_at=snap.now,
                groups=groups,
                verdicts=tuple(verdicts),
                events=tuple(events),
                expired_nodes=tuple(snap.expired_ids),
                clusters=clusters,
            )
            return self._last

    # ---- tick phases (the methods are called with the lock held) ---------------------

    def _snapshot(self) -> _Snapshot:
        """Phase 1: expire silent nodes, drop empty groups, copy the columns."""
        now = self._clock.now()
        expired, expired_ids = self._expire(self._clock.monotonic(), self._config.node_ttl)
        n, gn = self._n, self._gn
        idx = np.flatnonzero(self._occupied[:n])
        live_groups = self._drop_empty_groups(idx)
        return _Snapshot(
            now=now,
            expired=expired,
            expired_ids=expired_ids,
            idx=idx,
            live_groups=live_groups,
            scores=self._score[idx],
            gids=self._gid[idx],
            active=self._active[idx],
            idle=self._idle[idx],
            was=self._straggler[idx],
            consec=self._consec[idx],
            since=self._since[idx],
            episode_gids=self._episode_gid[idx],
            prev_ema=self._ema[:gn].copy(),
            prev_panic=self._panic[:gn].copy(),
            gkeys=self._gkey[:gn],
            gcluster=self._gcluster[:gn],
            gjob=self._gjob[:gn],
            gworkload=self._gworkload[:gn],
        )

    def _store(self, snap: _Snapshot, out: _Outcome) -> None:
        """Phase 3: keep the per-node and per-group state for the next tick.

        Only the slots and groups of the snapshot are written: a slot or group freed in
        phase 1 may have been handed to a new node or group since.
        """
        idx, live = snap.idx, snap.live_groups
        self._straggler[idx] = out.straggler
        self._consec[idx] = out.consec
        self._since[idx] = out.since
        self._episode_gid[idx] = np.where(out.straggler, snap.gids, -1)
        self._ema[live] = out.ema[live]
        self._panic[live] = out.panic[live]

    def _closing_events(self, snap: _Snapshot, out: _Outcome) -> list[Event]:
        """``straggler_resolved`` for every episode that ended this tick (except expiry)."""
        events: list[Event] = []
        for pos in np.flatnonzero(out.leaving).tolist():
            slot = int(snap.idx[pos])
            g_old = int(snap.episode_gids[pos])
            g_new = int(snap.gids[pos])
            if not snap.active[pos]:
                reason = "inactive"
            elif g_new != g_old:
                reason = "group_changed"
            elif not out.quorum[g_new]:
                reason = "quorum_lost"
            else:
                reason = "recovered"
            # The figures of the group the node is judged in now, if it still is.
            g_now = g_new if reason in ("recovered", "quorum_lost") else g_old
            closing = _Closing(
                node_id=self._node_id[slot],
                cluster_id=snap.gcluster[g_old],
                group=snap.gkeys[g_old],
                job_id=snap.gjob[g_old],
                rank=self._rank[slot],
                score=float(snap.scores[pos]),
                event_id=self._episode_id[slot],
                since=float(snap.since[pos]),
                dominant_signal=self._signal[slot],
                threshold=_finite(out.threshold[g_now]),
                panic=bool(out.panic[g_now]),
            )
            events.append(_resolved_event(closing, snap.now, reason))
        return events

    def _open_episodes(
        self, snap: _Snapshot, out: _Outcome
    ) -> tuple[list[NodeVerdict], list[Event]]:
        """Verdicts for every straggler; a ``straggler_state`` event for each new one."""
        verdicts: list[NodeVerdict] = []
        events: list[Event] = []
        sel = np.flatnonzero(out.straggler)
        thr = out.threshold.tolist()
        panic = out.panic.tolist()
        # Plain lists: indexing numpy scalars one by one costs more than the conversion.
        rows = zip(
            snap.idx[sel].tolist(),
            snap.gids[sel].tolist(),
            snap.scores[sel].tolist(),
            out.entering[sel].tolist(),
            out.consec[sel].tolist(),
            out.since[sel].tolist(),
            strict=True,
        )
        for slot, g, score, enters, ticks, began in rows:
            if enters:
                self._episode_id[slot] = new_event_id()
                events.append(
                    Event(
                        type="straggler_state",
                        node_id=self._node_id[slot],
                        cluster_id=snap.gcluster[g],
                        timestamp=snap.now,
                        event_id=self._episode_id[slot],
                        job_id=snap.gjob[g],
                        rank=self._rank[slot],
                        score=score,
                        threshold=thr[g],
                        detection_mode=DETECTION_MODE,
                        dominant_signal=self._signal[slot],
                        extra={"group": snap.gkeys[g], "panic": panic[g]},
                    )
                )
            verdicts.append(
                NodeVerdict(
                    node_id=self._node_id[slot],
                    cluster_id=snap.gcluster[g],
                    group=snap.gkeys[g],
                    job_id=snap.gjob[g],
                    rank=self._rank[slot],
                    score=score,
                    threshold=thr[g],
                    straggler=True,
                    consecutive_straggler_ticks=ticks,
                    since=began,
                    panic=panic[g],
                    quorum_met=True,
                    dominant_signal=self._signal[slot],
                    event_id=self._episode_id[slot],
                )
            )
        return verdicts, events

    # ---- bookkeeping (called with the lock held) --------------------------------------

    def _new_slot(self, node_id: str) -> int:
        if self._free_slots:
            slot = self._free_slots.pop()
        else:
            if self._n == self._occupied.size:
                self._grow_slots()
            slot = self._n
            self._n += 1
        self._slot_of[node_id] = slot
        self._node_id[slot] = node_id
        self._occupied[slot] = True
        self._straggler[slot] = False
        self._consec[slot] = 0
        self._since[slot] = np.nan
        self._episode_gid[slot] = -1
        self._episode_id[slot] = ""
        return slot

    def _grow_slots(self) -> None:
        extra = self._occupied.size
        self._occupied = np.concatenate([self._occupied, np.zeros(extra, dtype=np.bool_)])
        self._score = np.concatenate([self._score, np.zeros(extra)])
        self._gid = np.concatenate([self._gid, np.zeros(extra, dtype=np.int64)])
        self._active = np.concatenate([self._active, np.zeros(extra, dtype=np.bool_)])
        self._idle = np.concatenate([self._idle, np.zeros(extra, dtype=np.bool_)])
        self._seen = np.concatenate([self._seen, np.zeros(extra)])
        self._straggler = np.concatenate([self._straggler, np.zeros(extra, dtype=np.bool_)])
        self._consec = np.concatenate([self._consec, np.zeros(extra, dtype=np.int64)])
        self._since = np.concatenate([self._since, np.full(extra, np.nan)])
        self._episode_gid = np.concatenate([self._episode_gid, np.full(extra, -1, dtype=np.int64)])
        self._node_id.extend([""] * extra)
        self._rank.extend([None] * extra)
        self._signal.extend([None] * extra)
        self._episode_id.extend([""] * extra)
        self._meta.extend([None] * extra)

    def _new_group(self, key: str, push: NodePush) -> int:
        if self._free_gids:
            gid = self._free_gids.pop()
        else:
            if self._gn == self._ema.size:
                self._grow_groups()
            gid = self._gn
            self._gn += 1
        self._gid_of[key] = gid
        self._gkey[gid] = key
        self._gcluster[gid] = push.cluster_id
        self._gjob[gid] = push.job_id or None
        self._gworkload[gid] = None if push.job_id else (push.workload_type or "unknown")
        self._ema[gid] = np.nan
        self._panic[gid] = False
        return gid

    def _grow_groups(self) -> None:
        extra = self._ema.size
        self._ema = np.concatenate([self._ema, np.full(extra, np.nan)])
        self._panic = np.concatenate([self._panic, np.zeros(extra, dtype=np.bool_)])
        self._gkey.extend([""] * extra)
        self._gcluster.extend([""] * extra)
        self._gjob.extend([None] * extra)
        self._gworkload.extend([None] * extra)

    def _expire(self, mono: float, ttl: float) -> tuple[list[_Closing], list[str]]:
        """Free the slots of nodes silent for ``ttl`` seconds or more."""
        n = self._n
        stale = np.flatnonzero(self._occupied[:n] & (mono - self._seen[:n] >= ttl))
        closing: list[_Closing] = []
        expired: list[str] = []
        for slot in stale.tolist():
            node_id = self._node_id[slot]
            expired.append(node_id)
            if self._straggler[slot]:
                gid = int(self._episode_gid[slot])
                closing.append(
                    _Closing(
                        node_id=node_id,
                        cluster_id=self._gcluster[gid],
                        group=self._gkey[gid],
                        job_id=self._gjob[gid],
                        rank=self._rank[slot],
                        score=float(self._score[slot]),
                        event_id=self._episode_id[slot],
                        since=float(self._since[slot]),
                        dominant_signal=self._signal[slot],
                        threshold=_finite(self._ema[gid]),
                        panic=bool(self._panic[gid]),
                    )
                )
            del self._slot_of[node_id]
            self._occupied[slot] = False
            self._straggler[slot] = False
            self._node_id[slot] = ""
            self._meta[slot] = None
            self._free_slots.append(slot)
        return closing, expired

    def _drop_empty_groups(self, idx: IntArray) -> IntArray:
        """Forget groups no tracked node belongs to; return the indices of the others."""
        gn = self._gn
        tracked = np.bincount(self._gid[idx], minlength=gn) > 0
        for gid in np.flatnonzero(~tracked).tolist():
            key = self._gkey[gid]
            if key:
                del self._gid_of[key]
                self._gkey[gid] = ""
                self._free_gids.append(gid)
        return np.flatnonzero(tracked)


def _finite(value: float | np.floating) -> float | None:
    number = float(value)
    return number if math.isfinite(number) else None


def _floats(values: np.ndarray) -> list[float | None]:
    """Python floats, NaN (no value) as None."""
    return [v if math.isfinite(v) else None for v in values.tolist()]


def _empty_view(cluster_id: str, group: str) -> ThresholdView:
    """A group no tick has seen yet: no threshold, no quorum."""
    return ThresholdView(
        cluster_id=cluster_id,
        group=group,
        threshold=None,
        median=None,
        mad=None,
        quorum_met=False,
        panic=False,
        active_nodes=0,
        computed_at=None,
    )


def _resolved_event(closing: _Closing, now: float, reason: str) -> Event:
    """The event that ends a straggler episode; it reuses the episode's event id."""
    return Event(
        type="straggler_resolved",
        node_id=closing.node_id,
        cluster_id=closing.cluster_id,
        timestamp=now,
        event_id=closing.event_id,
        job_id=closing.job_id,
        rank=closing.rank,
        score=closing.score,
        threshold=closing.threshold,
        detection_mode=DETECTION_MODE,
        dominant_signal=closing.dominant_signal,
        extra={
            "group": closing.group,
            "panic": closing.panic,
            "reason": reason,
            "since": closing.since,
            "duration_s": now - closing.since,
        },
    )


def _compute(snap: _Snapshot, config: FleetConfig) -> _Outcome:
    """Phase 2 (pure, unlocked): group statistics and the straggler state of every node."""
    tcfg = config.threshold
    gn = snap.prev_ema.size
    act_gids = snap.gids[snap.active]
    act_scores = snap.scores[snap.active]
    figs = th.group_figures(act_scores, act_gids, gn)
    quorum = figs.counts >= config.quorum.statistical_min
    raw = th.raw_thresholds(figs.median, figs.mad, tcfg.k, tcfg.min_margin)
    # The EMA runs only while a group has quorum; losing quorum restarts it.
    ema = np.where(quorum, th.ema(snap.prev_ema, raw, tcfg.ema_alpha), np.nan)
    threshold = np.where(quorum, ema, raw)
    n_below = th.below_counts(act_scores, threshold, act_gids, gn)
    panic = th.panic_mask(n_below, figs.counts, quorum, tcfg.panic_fraction)
    # An episode belongs to a group: after a move the node starts afresh in its new one.
    was_here = snap.was & (snap.episode_gids == snap.gids)
    straggler = np.zeros(snap.idx.size, dtype=np.bool_)
    straggler[snap.active] = th.classify(
        act_scores, threshold[act_gids], tcfg.hysteresis, was_here[snap.active], quorum[act_gids]
    )
    continuing = straggler & was_here
    entering = straggler & ~was_here
    return _Outcome(
        figs=figs,
        raw=raw,
        ema=ema,
        threshold=threshold,
        quorum=quorum,
        panic=panic,
        n_active=figs.counts,
        n_idle=np.bincount(snap.gids[snap.idle], minlength=gn),
        n_tracked=np.bincount(snap.gids, minlength=gn),
        n_below=n_below,
        n_straggler=np.bincount(snap.gids[straggler], minlength=gn),
        straggler=straggler,
        entering=entering,
        leaving=snap.was & ~continuing,
        consec=np.where(straggler, np.where(continuing, snap.consec + 1, 1), 0),
        since=np.where(entering, snap.now, np.where(straggler, snap.since, np.nan)),
    )


def _degraded_events(snap: _Snapshot, out: _Outcome) -> list[Event]:
    """One ``group_degraded`` per group whose panic episode began this tick."""
    return [
        Event(
            type="group_degraded",
            node_id="",
            cluster_id=snap.gcluster[g],
            timestamp=snap.now,
            job_id=snap.gjob[g],
            threshold=_finite(out.threshold[g]),
            detection_mode=DETECTION_MODE,
            extra={
                "group": snap.gkeys[g],
                "panic": True,
                "below_nodes": int(out.n_below[g]),
                "active_nodes": int(out.n_active[g]),
                "median": _finite(out.figs.median[g]),
            },
        )
        for g in np.flatnonzero(out.panic & ~snap.prev_panic).tolist()
    ]


def _summaries(
    snap: _Snapshot, out: _Outcome, config: FleetConfig
) -> tuple[tuple[GroupStats, ...], tuple[ClusterStats, ...], dict[str, ThresholdView]]:
    """Per-group figures, per-cluster counts and the views served until the next tick."""
    qcfg = config.quorum
    now = snap.now
    live_groups = snap.live_groups
    gkeys, gcluster = snap.gkeys, snap.gcluster
    live = live_groups.tolist()
    # Plain lists: indexing numpy scalars one by one costs more than the conversion.
    active_l = out.n_active[live_groups].tolist()
    idle_l = out.n_idle[live_groups].tolist()
    tracked_l = out.n_tracked[live_groups].tolist()
    per_cluster: dict[str, list[int]] = {}
    for g, act, idl, tracked in zip(live, active_l, idle_l, tracked_l, strict=True):
        counts = per_cluster.setdefault(gcluster[g], [0, 0, 0, 0])
        counts[0] += act
        counts[1] += idl
        counts[2] += tracked
        counts[3] += 1
    low_of: dict[str, bool] = {}
    clusters: list[ClusterStats] = []
    for cluster_id, (act, idl, tracked, ngroups) in sorted(per_cluster.items()):
        low = act < qcfg.coverage_fraction * qcfg.max_expected_nodes
        low_of[cluster_id] = low
        clusters.append(
            ClusterStats(
                cluster_id=cluster_id,
                active_nodes=act,
                idle_nodes=idl,
                tracked_nodes=tracked,
                groups=ngroups,
                coverage_low=low,
                computed_at=now,
            )
        )
    columns = zip(
        live,
        _floats(out.threshold[live_groups]),
        _floats(out.raw[live_groups]),
        _floats(out.figs.median[live_groups]),
        _floats(out.figs.mad[live_groups]),
        out.quorum[live_groups].tolist(),
        out.panic[live_groups].tolist(),
        active_l,
        idle_l,
        tracked_l,
        out.n_below[live_groups].tolist(),
        out.n_straggler[live_groups].tolist(),
        strict=True,
    )
    groups: list[GroupStats] = []
    views: dict[str, ThresholdView] = {}
    for g, t, r, median, mad, q, p, act, idl, tracked, below, stragglers in columns:
        groups.append(
            GroupStats(
                cluster_id=gcluster[g],
                group=gkeys[g],
                job_id=snap.gjob[g],
                workload_type=snap.gworkload[g],
                threshold=t,
                raw_threshold=r,
                median=median,
                mad=mad,
                quorum_met=q,
                panic=p,
                active_nodes=act,
                idle_nodes=idl,
                straggler_count=stragglers,
                coverage_low=low_of[gcluster[g]],
                computed_at=now,
                below_count=below,
                tracked_nodes=tracked,
            )
        )
        views[gkeys[g]] = ThresholdView(
            cluster_id=gcluster[g],
            group=gkeys[g],
            threshold=t if q else None,
            median=median,
            mad=mad,
            quorum_met=q,
            panic=p,
            active_nodes=act,
            computed_at=now,
        )
    return tuple(groups), tuple(clusters), views
