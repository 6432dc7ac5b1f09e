"""One tick's computation, pure: the columns a tick copied from the score store in, the
group statistics, the straggler state of every node and the group summaries out.

:class:`ingero.fleet.state.FleetState` (the slot store) takes the :class:`Snapshot` under
its lock, calls :func:`compute` and :func:`summaries` without it, and stores the
:class:`Outcome` back; the figures themselves are ``ingero.fleet.threshold``'s, what each
episode event says ``ingero.fleet.episodes``'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ingero.fleet import threshold as th
from ingero.fleet.config import FleetConfig
from ingero.fleet.episodes import Closing, degraded_event
from ingero.fleet.model import ClusterStats, GroupStats, NodeKey
from ingero.fleet.threshold import BoolArray, FloatArray, IntArray
from ingero.otlp.health import PEER_RATES
from ingero.otlp.threshold import ThresholdView
from ingero.schema.events import Event


@dataclass
class Snapshot:
    """Phase 1's copies: per tracked node (``idx`` are their slots) and per group index."""

    now: float
    mono: float
    expired: list[Closing]
    expired_ids: list[NodeKey]
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
    rates: FloatArray  # (node, PEER_RATES) raw rates, NaN where not pushed
    stalled: BoolArray
    stall_episode: BoolArray
    recent: IntArray  # ticks below the threshold lately, a bit each (newest: bit 0)
    exits: IntArray  # measured ticks in a row at threshold + hysteresis, in the episode
    pending: BoolArray
    # The node pushed a new measurement since the last tick (not only held ones, or none).
    fresh: BoolArray
    lagging: BoolArray  # a rank of the node is flagged peer_lag in its group's communicator
    # The node's episode was a straggler by peer lag alone at the last tick: once the lag
    # clears, the episode still waits for the exit rule, and its cause is still the lag.
    lag_episode: BoolArray
    noise: th.NodeNoise  # each node's last measured score and its noise
    prev_ema: FloatArray
    prev_panic: BoolArray
    gkeys: list[str]
    gcluster: list[str]
    gjob: list[str | None]
    gworkload: list[str | None]


@dataclass
class Outcome:
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
    recent: IntArray
    exits: IntArray
    peer: FloatArray  # (group, PEER_RATES) medians, NaN without quorum
    # Stragglers by peer_lag alone (their score is not below, nor held), and lag episodes
    # waiting for the exit rule after the lag cleared.
    by_lag: BoolArray
    # Entering by peer lag alone, its score not below the threshold: the node cannot have
    # opened an episode of its own (it learns of the lag from Fleet's replies), so Fleet
    # announces it at once instead of offering its id for one push.
    lag_entry: BoolArray
    noise: th.NodeNoise
    group_noise: FloatArray  # per group, NaN where no node has a noise yet


def finite(value: float | np.floating) -> float | None:
    number = float(value)
    return number if math.isfinite(number) else None


def floats(values: np.ndarray) -> list[float | None]:
    """Python floats, NaN (no value) as None."""
    return [v if math.isfinite(v) else None for v in values.tolist()]


def compute(snap: Snapshot, config: FleetConfig) -> Outcome:
    """Phase 2 (pure, unlocked): group statistics and the straggler state of every node."""
    tcfg = config.threshold
    gn = snap.prev_ema.size
    act_gids = snap.gids[snap.active]
    act_scores = snap.scores[snap.active]
    figs = th.group_figures(act_scores, act_gids, gn)
    quorum = figs.counts >= config.quorum.statistical_min
    # The enter rule fleet-push applies too: below in enter_intervals of the last
    # enter_window measurements (one noisy one above does not restart the count). A tick
    # counts a node's score only when the node pushed a new measurement since the last
    # tick: a held push (or none) repeats one already counted, and two of one measurement
    # are not two intervals below. The noise, too, is a change between measurements.
    measured = snap.active & snap.fresh
    noise = th.node_noise(snap.noise, snap.scores, snap.gids, measured)
    group_noise = th.group_noise(noise.noise[snap.active], act_gids, gn)
    raw = th.raw_thresholds(
        figs.median, figs.mad, tcfg.k, tcfg.min_margin, group_noise, tcfg.noise_k
    )
    # The EMA runs only while a group has quorum; losing quorum restarts it.
    ema = np.where(quorum, th.ema(snap.prev_ema, raw, tcfg.ema_alpha), np.nan)
    threshold = np.where(quorum, ema, raw)
    n_below = th.below_counts(act_scores, threshold, act_gids, gn)
    panic = th.panic_mask(n_below, figs.counts, quorum, tcfg.panic_fraction)
    # An episode belongs to a group: after a move the node starts afresh in its new one.
    was_here = snap.was & (snap.episode_gids == snap.gids)
    # The exit rule, fleet-push's too: at threshold + hysteresis in exit_intervals
    # measurements in a row (one noisy one above does not end the episode of a node still
    # slow); a measurement below that level, or a lagging rank, starts the count again.
    recovering = np.zeros(snap.idx.size, dtype=np.bool_)
    recovering[snap.active] = act_scores >= threshold[act_gids] + tcfg.hysteresis
    exits = np.where(measured, np.where(recovering, snap.exits + 1, 0), snap.exits)
    exits = np.where(was_here & ~snap.lagging, exits, 0)
    straggler = np.zeros(snap.idx.size, dtype=np.bool_)
    straggler[snap.active] = th.classify(
        act_scores,
        threshold[act_gids],
        was_here[snap.active],
        (exits >= tcfg.exit_intervals)[snap.active],
        quorum[act_gids],
    )
    under = np.zeros(snap.idx.size, dtype=np.bool_)  # the score under its threshold now
    under[snap.active] = act_scores < threshold[act_gids]
    below = under & quorum[snap.gids] & measured
    window = (1 << max(tcfg.enter_window, tcfg.enter_intervals)) - 1
    shifted = ((snap.recent << 1) | below) & window
    recent = np.where(measured, shifted, np.where(snap.active, snap.recent, 0))
    straggler &= was_here | (below & (np.bitwise_count(recent) >= tcfg.enter_intervals))
    # A rank flagged peer_lag is late in most of a window of collectives already: it needs
    # no streak of its own. It needs its group's quorum, as a score does, so the drain rules
    # (no_quorum, panic) judge it as any other straggler.
    lagging = snap.lagging & snap.active & quorum[snap.gids]
    # By the lag alone where the score does not hold it: not a straggler by score, or one
    # only because the lag keeps the exit count from starting (its score is recovered).
    by_score = straggler & ~recovering
    straggler |= lagging
    # A lag episode whose lag has cleared stays one while it waits for the exit rule (its
    # score at or above the threshold): the score was never its cause, and a verdict (a
    # drain's reason) must not name it; a score that falls below makes it a score episode.
    by_lag = straggler & ((lagging & ~by_score) | (snap.lag_episode & was_here & ~under))
    # An episode's ticks count towards no later one (fleet-push starts afresh too).
    recent = np.where(straggler, 0, recent)
    continuing = straggler & was_here
    entering = straggler & ~was_here
    return Outcome(
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
        recent=recent,
        exits=np.where(continuing, exits, 0),
        peer=_peer_medians(snap, config.quorum.statistical_min, gn),
        by_lag=by_lag,
        lag_entry=entering & lagging & ~under,
        noise=noise,
        group_noise=group_noise,
    )


def _peer_medians(snap: Snapshot, quorum: int, gn: int) -> FloatArray:
    """Per group and peer rate, the median over the active, not stalled nodes that pushed
    it; NaN where fewer than ``quorum`` did (a stalled rank must not pull its peers down)."""
    peer = np.full((gn, len(PEER_RATES)), np.nan)
    working = snap.active & ~snap.stalled
    for j in range(len(PEER_RATES)):
        column = snap.rates[:, j]
        have = working & ~np.isnan(column)
        if not have.any():
            continue
        median, counts = th.segment_median(column[have], snap.gids[have], gn)
        peer[:, j] = np.where(counts >= quorum, median, np.nan)
    return peer


def degraded_events(snap: Snapshot, out: Outcome) -> list[Event]:
    """One ``group_degraded`` per group whose panic episode began this tick."""
    return [
        degraded_event(
            cluster_id=snap.gcluster[g],
            group=snap.gkeys[g],
            job_id=snap.gjob[g],
            threshold=finite(out.threshold[g]),
            below_nodes=int(out.n_below[g]),
            active_nodes=int(out.n_active[g]),
            median=finite(out.figs.median[g]),
            now=snap.now,
        )
        for g in np.flatnonzero(out.panic & ~snap.prev_panic).tolist()
    ]


def summaries(
    snap: Snapshot, out: Outcome, config: FleetConfig
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
        floats(out.threshold[live_groups]),
        floats(out.raw[live_groups]),
        floats(out.figs.median[live_groups]),
        floats(out.figs.mad[live_groups]),
        floats(out.group_noise[live_groups]),
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
    for g, t, r, median, mad, noise, q, p, act, idl, tracked, below, stragglers in columns:
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
                noise=noise,
            )
        )
        medians = {
            name: float(v)
            for name, v in zip(PEER_RATES, out.peer[g].tolist(), strict=True)
            if v == v  # not NaN
        }
        views[gkeys[g]] = ThresholdView(
            peer_rates=medians or None,
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
