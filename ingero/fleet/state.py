"""Fleet's in-memory score map (the slot store) and its tick: pure state, driven by an
injected clock.

The daemon calls :meth:`FleetState.ingest` from many receiver threads (O(1): it stores the
node's latest score and returns the threshold computed at the last tick) and
:meth:`FleetState.tick` once per push interval. Scores live in flat numpy columns indexed
by a slot per node, so a tick is a handful of vectorised passes over all nodes. A node is
its (cluster id, node id): node ids repeat across clusters (every Slurm site has a gpu01).

A tick works in three phases so that pushes are never blocked by the sorts: under the lock
it expires silent nodes and copies the columns (``_snapshot``); without the lock it computes
the group statistics, classifies nodes and builds the group summaries (``ingero.fleet.tick``,
pure); under the lock again it stores the new per-node state, builds events
and verdicts and publishes the views. Only ticks free slots and groups (ticks are
serialised), so the slots copied in phase one still belong to the same nodes in phase three.
What each episode event says (and why an episode ended) is ``ingero.fleet.episodes``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Collection, Mapping
from typing import Literal, NamedTuple

import numpy as np

from ingero.fleet.collectives import CollectiveJoin, NcclTick
from ingero.fleet.communicator import NcclNamed
from ingero.fleet.config import FleetConfig
from ingero.fleet.episodes import (
    Closing,
    closing_reason,
    judged_in_new_group,
    resolved_event,
    started_event,
)
from ingero.fleet.model import (
    CapacityError,
    GroupStats,
    NodeKey,
    NodeReport,
    NodeVerdict,
    PeerLagCause,
    TickResult,
)
from ingero.fleet.node_view import empty_view, node_view
from ingero.fleet.ownership import Ownership
from ingero.fleet.slots import SLOT_COLUMNS, Meta
from ingero.fleet.threshold import BoolArray, FloatArray, IntArray, NodeNoise
from ingero.fleet.tick import Outcome, Snapshot, compute, degraded_events, finite, summaries
from ingero.otlp.health import NODE_STATES, PEER_RATES, NodePush, group_key
from ingero.otlp.limits import check_lengths, shown
from ingero.otlp.threshold import ThresholdView
from ingero.runtime.clock import Clock
from ingero.schema.causes import class_from_signal
from ingero.schema.events import Event, new_event_id

_INITIAL_CAPACITY = 1024
_NAN = math.nan
_INF = math.inf


def validate_push(push: NodePush) -> float:
    """The push's score as a float; ValueError naming the field when the push is unusable
    (ValueTooLong for a string over MAX_ID_CHARS: what a node keeps here is bounded)."""
    if not isinstance(push.node_id, str) or not push.node_id:
        raise ValueError("push has no node id")
    if not isinstance(push.cluster_id, str) or not push.cluster_id:
        raise ValueError(f"push from {shown(push.node_id)} has no cluster id")
    check_lengths(
        (
            ("node id", push.node_id),
            ("cluster id", push.cluster_id),
            ("job id", push.job_id),
            ("workload type", push.workload_type),
            ("dominant signal", push.dominant_signal),
            ("host name", push.host_name),
            ("GPU model", push.gpu_model),
            ("provider", push.provider),
            ("episode id", push.episode_id),
            ("service", push.service),
        )
    )
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


class FleetState:
    """Latest score of every node, per-group thresholds and per-node straggler episodes."""

    # The per-slot columns (SLOT_COLUMNS makes them), indexed by slot.
    _occupied: BoolArray
    _score: FloatArray
    _gid: IntArray
    _active: BoolArray
    _idle: BoolArray
    _seen: FloatArray
    _straggler: BoolArray
    _consec: IntArray
    _since: FloatArray
    _episode_gid: IntArray
    _rates: FloatArray  # a row of PEER_RATES per slot
    _stalled: BoolArray
    # The episode was (or became) a stall: ending inactive means its job ended.
    _stall_episode: BoolArray
    _recent: IntArray  # ticks below the threshold lately, a bit each (newest: bit 0)
    _exits: IntArray  # measured ticks in a row at threshold + hysteresis, in the episode
    # The score of the node's last measurement, the weighted mean of its change from one
    # to the next, how many changes that holds, and the group it was measured in
    # (ingero.fleet.threshold.node_noise).
    _last_measured: FloatArray
    _noise: FloatArray
    _noise_count: IntArray
    _noise_gid: IntArray
    # An episode Fleet opened and has not announced yet: it waits for one push from the
    # node, whose own episode id (if the node opened one meanwhile) it then adopts.
    _pending: BoolArray
    _pending_at: FloatArray
    # The node pushed a new measurement (a push that did not hold) since the last tick.
    _fresh: BoolArray
    # The node's last push said whether it held (ingero.node.held); else every tick
    # counts its score, as for an agent that does not say.
    _says_held: BoolArray
    _reported: list[str | None]  # the node's episode id, last push
    _key: list[NodeKey]
    _rank: list[int | None]
    _signal: list[str | None]
    _cause: list[str | None]  # the node's cause class, last push (None: it says none)
    _episode_id: list[str]
    _meta: list[Meta | None]

    def __init__(self, config: FleetConfig, clock: Clock) -> None:
        self._config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._tick_lock = threading.Lock()
        self._max_nodes = config.limits.max_nodes
        # Nodes: a slot per (cluster_id, node_id), since node ids are unique only within a
        # cluster; numpy columns for what the tick computes on.
        self._slot_of: dict[NodeKey, int] = {}
        self._free_slots: list[int] = []
        self._n = 0  # slots in use are below this mark
        for column in SLOT_COLUMNS:
            setattr(self, column.attr, column.make(_INITIAL_CAPACITY))
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
        # NCCL communicators joined across ranks: its own lock, fed after a push
        # is stored; the per-node lag it flags is published here by each tick.
        self._nccl = CollectiveJoin(config.nccl, config.node_ttl)
        self._peer_lag: dict[NodeKey, float] = {}
        # The stragglers by peer lag alone at the last tick, with the flagged rank that
        # made each one: a lag episode waiting for the exit rule still names it.
        self._lag_cause: dict[NodeKey, PeerLagCause] = {}
        self._named: dict[NodeKey, NcclNamed] = {}
        # The nodes whose NCCL rank waits at a collective for others, as the last tick saw.
        self._waiting: dict[NodeKey, dict[str, object]] = {}
        # Which clusters this replica owns for drains (several replicas behind a balancer).
        self._owners = Ownership(
            float(config.push_interval), config.node_ttl, config.drain.min_intervals
        )

    # ---- hot path -------------------------------------------------------------------

    def ingest(self, push: NodePush) -> ThresholdView:
        """Store a node's latest push; return its group's threshold as of the last tick.

        Raises ValueError for an unusable push (the map is left untouched) and
        CapacityError for a new node when ``limits.max_nodes`` are already tracked.
        """
        score = validate_push(push)
        key = push.group
        node = (push.cluster_id, push.node_id)
        with self._lock:
            slot = self._slot_of.get(node)
            gid = self._gid_of.get(key)
            if slot is None and len(self._slot_of) >= self._max_nodes:
                raise CapacityError(
                    f"fleet tracks {self._max_nodes} nodes (limits.max_nodes); "
                    f"refusing new node {push.node_id}"
                )
            if gid is None and len(self._gid_of) >= 2 * self._max_nodes:
                raise CapacityError(f"too many peer groups; refusing group {key}")
            if slot is None:
                slot = self._new_slot(node)
            if gid is None:
                gid = self._new_group(key, push)
            self._score[slot] = score
            self._gid[slot] = gid
            self._active[slot] = push.state == "active"
            self._idle[slot] = push.state == "idle"
            mono = float(self._clock.monotonic())
            self._seen[slot] = mono
            self._owners.pushed(push.cluster_id, mono)
            self._rank[slot] = push.rank
            self._signal[slot] = push.dominant_signal
            self._cause[slot] = push.cause_class
            self._meta[slot] = (push.host_name, push.gpu_model, push.gpu_count, push.provider)
            pushed = push.rates
            if pushed:
                # One item at a time: numpy converts a list for a row assignment (~1 µs a
                # push); _rate inline (NaN where missing, not finite or below 0).
                rates = self._rates
                for i, name in enumerate(PEER_RATES):
                    value = pushed.get(name)
                    rates[slot, i] = value if value is not None and 0 <= value < _INF else _NAN
            else:  # a node that sends no rates: one fill, not six items
                self._rates[slot] = _NAN
            self._stalled[slot] = push.stalled
            self._reported[slot] = push.episode_id
            # A held push repeats the last measurement: it keeps the node live and its
            # score in the group's statistics, but its enter window waits for a new one.
            # Written only when it changes something: an in-place |= on a numpy item
            # costs 1.7 µs, a plain write 0.1 µs.
            held = push.held
            if held is False:
                self._fresh[slot] = True
            self._says_held[slot] = held is not None
            view = self._views.get(key)
            episode = self._episode_id[slot] if self._straggler[slot] else ""
            lag = self._peer_lag.get(node)
            named = self._named.get(node)
            waiting = self._waiting.get(node)
        self._nccl.ingest(push, mono, self._clock.now())
        if view is None:
            return empty_view(push.cluster_id, key)
        return node_view(view, push.rates, episode, lag, named, waiting)

    # ---- reads ----------------------------------------------------------------------

    def threshold_view(
        self,
        cluster_id: str,
        job_id: str | None = None,
        workload_type: str | None = None,
        node_id: str | None = None,
        service: str | None = None,
    ) -> ThresholdView | None:
        """The group's view as of the last tick, or None when the group is unknown; with
        ``node_id`` (a node of that group, in that cluster) also the node's rate ratios and
        open episode."""
        key = group_key(cluster_id, job_id, workload_type, service)
        node = (cluster_id, node_id or "")
        with self._lock:
            view = self._views.get(key)
            slot = self._slot_of.get(node) if node_id else None
            if view is None or slot is None or self._gkey[int(self._gid[slot])] != key:
                return view
            rates = dict(zip(PEER_RATES, self._rates[slot].tolist(), strict=True))
            episode = self._episode_id[slot] if self._straggler[slot] else ""
            lag = self._peer_lag.get(node)
            named = self._named.get(node)
            waiting = self._waiting.get(node)
        return node_view(view, rates, episode, lag, named, waiting)

    def node_report(self, cluster_id: str, node_id: str) -> NodeReport | None:
        """The node's last push as the drain controller asks for it; None: not tracked
        (never pushed, or expired)."""
        with self._lock:
            slot = self._slot_of.get((cluster_id, node_id))
            if slot is None:
                return None
            active, idle = bool(self._active[slot]), bool(self._idle[slot])
            state = "active" if active else "idle" if idle else "stale"
            return NodeReport(state, self._cause[slot])

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

    def clock_offsets(self) -> list[tuple[str, str, float, float]]:
        """(cluster_id, node_id, offset s, uncertainty s) of the nodes that reported one."""
        return self._nccl.clock_offsets()

    def scores_snapshot(
        self, lowest: int | None = None, first: Collection[NodeKey] = ()
    ) -> list[NodeScore]:
        """Every active or idle node's latest push (for Echo's score history).

        With ``lowest``: at most that many nodes, those named in ``first`` (by cluster_id,
        node_id) before the lowest scores (Fleet's per-node series); a partition, so only
        the rows kept are built however many nodes there are.

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
            keys, ranks, signals, metas = (
                self._key[:n],
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
                    node_id=keys[slot][1],
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
        # The communicators first: the ranks they flag count in this tick's classification.
        nccl = self._nccl.tick(self._clock.now(), self._clock.monotonic())
        with self._lock:
            snap = self._snapshot(nccl)
        out = compute(snap, self._config)
        groups, clusters, views = summaries(snap, out, self._config)
        with self._lock:
            taken = self._owners.tick(
                snap.mono, ((g.cluster_id, g.group, g.quorum_met) for g in groups)
            )
            self._store(snap, out)
            events = [resolved_event(c, snap.now, "expired") for c in snap.expired]
            events.extend(self._closing_events(snap, out))
            events.extend(degraded_events(snap, out))
            verdicts, started = self._open_episodes(snap, out, nccl.causes)
            events.extend(started)
            events.extend(nccl.events)
            self._peer_lag = nccl.peer_lag
            self._named = nccl.named
            self._waiting = nccl.waiting
            self._views = views
            self._groups = groups
            return TickResult(
                computed_at=snap.now,
                groups=groups,
                verdicts=tuple(verdicts),
                events=tuple(events),
                expired_nodes=tuple(snap.expired_ids),
                clusters=clusters,
                nccl_comms=nccl.comms,
                hung_comms=nccl.hung,
                waiting_comms=nccl.waits,
                waiting_nodes=len(nccl.waiting),
                nccl_refused=nccl.refused,
                taken_over=tuple(taken),
                owned_clusters=self._owners.owned(snap.mono),
            )

    # ---- tick phases (the methods are called with the lock held) ---------------------

    def _snapshot(self, nccl: NcclTick) -> Snapshot:
        """Phase 1: expire silent nodes, drop empty groups, copy the columns."""
        now = self._clock.now()
        mono = self._clock.monotonic()
        expired, expired_ids = self._expire(mono, self._config.node_ttl)
        n, gn = self._n, self._gn
        idx = np.flatnonzero(self._occupied[:n])
        live_groups = self._drop_empty_groups(idx)
        # A node's flagged rank counts where the communicator is of the node's own group.
        lagging = np.zeros(idx.size, dtype=np.bool_)
        for node, group in nccl.lagging_groups.items():
            slot = self._slot_of.get(node)
            if slot is not None and self._gkey[int(self._gid[slot])] == group:
                lagging[np.searchsorted(idx, slot)] = True
        lag_episode = np.zeros(idx.size, dtype=np.bool_)
        for node in self._lag_cause:
            slot = self._slot_of.get(node)  # None once expired (_expire ran above)
            if slot is not None:
                lag_episode[np.searchsorted(idx, slot)] = True
        return Snapshot(
            now=now,
            mono=mono,
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
            rates=self._rates[idx],
            stalled=self._stalled[idx],
            stall_episode=self._stall_episode[idx],
            recent=self._recent[idx],
            exits=self._exits[idx],
            pending=self._pending[idx],
            fresh=self._take_fresh(idx),
            lagging=lagging,
            lag_episode=lag_episode,
            noise=NodeNoise(
                self._last_measured[idx],
                self._noise[idx],
                self._noise_count[idx],
                self._noise_gid[idx],
            ),
            prev_ema=self._ema[:gn].copy(),
            prev_panic=self._panic[:gn].copy(),
            gkeys=self._gkey[:gn],
            gcluster=self._gcluster[:gn],
            gjob=self._gjob[:gn],
            gworkload=self._gworkload[:gn],
        )

    def _take_fresh(self, idx: IntArray) -> BoolArray:
        """Which of the nodes ``idx`` have a new measurement to count at this tick: a push
        since the last tick that did not hold, or any time from a node that does not say
        whether its pushes hold; the next tick counts only what comes after this."""
        fresh = self._fresh[idx] | ~self._says_held[idx]
        self._fresh[idx] = False
        return fresh

    def _store(self, snap: Snapshot, out: Outcome) -> None:
        """Phase 3: keep the per-node and per-group state for the next tick.

        Only the slots and groups of the snapshot are written: a slot or group freed in
        phase 1 may have been handed to a new node or group since.
        """
        idx, live = snap.idx, snap.live_groups
        self._straggler[idx] = out.straggler
        self._consec[idx] = out.consec
        self._since[idx] = out.since
        self._episode_gid[idx] = np.where(out.straggler, snap.gids, -1)
        self._recent[idx] = out.recent
        self._exits[idx] = out.exits
        self._last_measured[idx] = out.noise.last
        self._noise[idx] = out.noise.noise
        self._noise_count[idx] = out.noise.count
        self._noise_gid[idx] = out.noise.gid
        self._pending[idx] &= out.straggler
        self._stall_episode[idx] &= out.straggler
        self._ema[live] = out.ema[live]
        self._panic[live] = out.panic[live]

    def _closing_events(self, snap: Snapshot, out: Outcome) -> list[Event]:
        """``straggler_resolved`` for every episode that ended this tick (except expiry)."""
        events: list[Event] = []
        for pos in np.flatnonzero(out.leaving).tolist():
            slot = int(snap.idx[pos])
            if snap.pending[pos] and not self._taken_up(slot):
                continue  # offered, never announced, and the node opened none: nothing to end
            g_old = int(snap.episode_gids[pos])
            g_new = int(snap.gids[pos])
            active = bool(snap.active[pos])
            # A node whose job left it (its push names no job any more), or a stall that
            # ends inactive, ended with its job.
            job_ended = (snap.gjob[g_old] is not None and snap.gjob[g_new] is None) or (
                not active and bool(snap.stall_episode[pos])
            )
            reason = closing_reason(active, g_new != g_old, bool(out.quorum[g_new]), job_ended)
            g_now = g_new if judged_in_new_group(reason) else g_old
            closing = self._closing(
                slot,
                (snap.gcluster[g_old], snap.gkeys[g_old], snap.gjob[g_old]),
                float(snap.scores[pos]),
                float(snap.since[pos]),
                finite(out.threshold[g_now]),
                bool(out.panic[g_now]),
            )
            if snap.pending[pos]:
                # The node announced this episode (under the offered id or its own) and it
                # ended before Fleet's announcement was due: Fleet tells it too, start and end.
                events.append(
                    started_event(
                        closing,
                        threshold=finite(out.threshold[g_old]),
                        panic=bool(out.panic[g_old]),
                        now=snap.now,
                        stall=bool(snap.stall_episode[pos]),
                    )
                )
            events.append(resolved_event(closing, snap.now, reason))
        return events

    def _taken_up(self, slot: int) -> bool:
        """Whether the node's push since Fleet offered its episode named an open episode of
        its own (the offered id, or one it opened meanwhile), which Fleet then adopts."""
        reported = self._reported[slot]
        if not reported or self._seen[slot] <= self._pending_at[slot]:
            return False
        self._episode_id[slot] = reported
        return True

    def _closing(
        self,
        slot: int,
        opened_in: tuple[str, str, str | None],
        score: float,
        since: float,
        threshold: float | None,
        panic: bool,
    ) -> Closing:
        """The ending episode of the node in ``slot``; ``opened_in`` is the (cluster id,
        group, job id) of the group it began in, ``threshold`` and ``panic`` those it ends
        under."""
        cluster_id, group, job_id = opened_in
        return Closing(
            node_id=self._key[slot][1],
            cluster_id=cluster_id,
            group=group,
            job_id=job_id,
            rank=self._rank[slot],
            score=score,
            event_id=self._episode_id[slot],
            since=since,
            dominant_signal=self._signal[slot],
            threshold=threshold,
            panic=panic,
        )

    def _open_episodes(
        self, snap: Snapshot, out: Outcome, causes: Mapping[NodeKey, PeerLagCause]
    ) -> tuple[list[NodeVerdict], list[Event]]:
        """Verdicts for every straggler; a ``straggler_state`` event for each new one.
        ``causes`` names the flagged NCCL rank of each node a straggler by peer lag alone."""
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
            out.by_lag[sel].tolist(),
            out.lag_entry[sel].tolist(),
            strict=True,
        )
        for slot, g, score, enters, ticks, began, lag, at_once in rows:
            # Announced first: it may give the episode its id, which the verdict carries.
            due = self._announce(slot, enters, snap.mono, at_once)
            node = self._key[slot]
            verdict = NodeVerdict(
                node_id=node[1],
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
                drain_owner=self._owners.owner(snap.gcluster[g], snap.gkeys[g], snap.mono),
                reason="peer_lag" if lag else "score",
                peer_lag=(causes.get(node) or self._lag_cause.get(node)) if lag else None,
                cause_class=self._cause[slot] or class_from_signal(self._signal[slot]),
            )
            if due:
                events.append(
                    started_event(
                        verdict,
                        threshold=verdict.threshold,
                        panic=verdict.panic,
                        now=snap.now,
                        stall=bool(self._stall_episode[slot]),
                        peer_lag=lag,
                        cause_class=verdict.cause_class,
                    )
                )
            verdicts.append(verdict)
        self._lag_cause = {
            (v.cluster_id, v.node_id): v.peer_lag for v in verdicts if v.peer_lag is not None
        }
        return verdicts, events

    def _announce(self, slot: int, enters: bool, mono: float, at_once: bool = False) -> bool:
        """Open or keep a straggler's episode; True when its ``straggler_state`` is due now.

        One episode, one id, whichever side saw it first: a node that already reported an
        open episode gives Fleet its id; a node that classifies itself but has none open yet
        may be opening one this very interval, so Fleet's new id is only offered (in the push
        reply, which the node adopts) and announced after one more push from the node, whose
        own id, if it came meanwhile, replaces Fleet's. An agent that does not report
        episodes (older) is announced at once, and so is a straggler by peer lag alone
        whose score is not below the threshold (``at_once``): the node learns of the lag
        from Fleet's reply and cannot have opened an episode of its own.
        """
        reported = self._reported[slot]
        if enters:
            self._stall_episode[slot] = self._stalled[slot]
            if reported:
                self._episode_id[slot] = reported
                return True
            self._episode_id[slot] = new_event_id()
            if reported == "" and not at_once:
                self._pending[slot] = True
                self._pending_at[slot] = mono
                return False
            return True
        self._stall_episode[slot] |= self._stalled[slot]
        if not self._pending[slot] or self._seen[slot] <= self._pending_at[slot]:
            return False
        if reported:
            self._episode_id[slot] = reported
        self._pending[slot] = False
        return True

    # ---- bookkeeping (called with the lock held) --------------------------------------

    def _new_slot(self, node: NodeKey) -> int:
        if self._free_slots:
            slot = self._free_slots.pop()
        else:
            if self._n == self._occupied.size:
                self._grow_slots()
            slot = self._n
            self._n += 1
        self._clear([slot])
        self._slot_of[node] = slot
        self._key[slot] = node
        self._occupied[slot] = True
        return slot

    def _grow_slots(self) -> None:
        extra = self._occupied.size
        for column in SLOT_COLUMNS:
            old, more = getattr(self, column.attr), column.make(extra)
            if isinstance(old, list):
                old.extend(more)
            else:
                setattr(self, column.attr, np.concatenate([old, more]))

    def _clear(self, slots: list[int]) -> None:
        """Every column of ``slots`` back to its fill: what a slot new to a node holds."""
        for column in SLOT_COLUMNS:
            values = getattr(self, column.attr)
            if isinstance(values, list):
                for slot in slots:
                    values[slot] = column.fill
            else:
                values[slots] = column.fill

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

    def _expire(self, mono: float, ttl: float) -> tuple[list[Closing], list[NodeKey]]:
        """Free the slots of nodes silent for ``ttl`` seconds or more."""
        n = self._n
        stale = np.flatnonzero(self._occupied[:n] & (mono - self._seen[:n] >= ttl))
        closing: list[Closing] = []
        expired: list[NodeKey] = []
        slots = stale.tolist()
        for slot in slots:
            node = self._key[slot]
            expired.append(node)
            if self._straggler[slot] and not self._pending[slot]:
                gid = int(self._episode_gid[slot])
                closing.append(
                    self._closing(
                        slot,
                        (self._gcluster[gid], self._gkey[gid], self._gjob[gid]),
                        float(self._score[slot]),
                        float(self._since[slot]),
                        finite(self._ema[gid]),
                        bool(self._panic[gid]),
                    )
                )
            del self._slot_of[node]
        self._clear(slots)
        self._free_slots.extend(slots)
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
