"""CUDA graph signals: graphs captured and instantiated again in the loop, and their cost."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from ingero.explain.analysis import fmt_ns, fmt_pct, fmt_rate
from ingero.explain.chains.signal import (
    Signal,
    baseline_median,
    count_growth,
    onset,
    per_tick,
    pids_text,
    proc_evidence,
    span,
    windows,
)
from ingero.explain.chains.timeline import OpPoint, Timeline
from ingero.nodedb.ops import GRAPH_BUILD_OPS

# The calls that end one graph build: an instantiation, or a capture's end where the job
# captures into graphs it updates (cuGraphExecUpdate) instead of instantiating them again.
BUILD_ENDS: Final = ("cudaGraphInstantiate", "cuGraphInstantiate")
CAPTURE_ENDS: Final = ("cudaStreamEndCapture", "cuStreamEndCapture")
# A graph built at start-up (or once after a shape change) is not a loop: a few builds in
# the recent window, at this many times the baseline's rate, are.
MIN_BUILDS: Final = 3
BUILD_GROWTH: Final = 3.0


def _builds(rows: Iterable[OpPoint]) -> int:
    """Graphs built by these rows: instantiations, else ended captures."""
    rows = list(rows)
    inst = sum(r.count for r in rows if r.op in BUILD_ENDS)
    ends = sum(r.count for r in rows if r.op in CAPTURE_ENDS)
    return inst or ends


def graph_recapture(t: Timeline) -> Signal | None:
    """Graphs captured and instantiated again in the loop: MIN_BUILDS or more in the recent
    window at BUILD_GROWTH times the baseline's rate, with the host time they took."""
    rows = [r for r in t.ops if r.op in GRAPH_BUILD_OPS]
    if not rows:
        return None
    recent_all, base_all = windows(t, t.ops)
    span_r = span((r.ts_start, r.ts_end) for r in recent_all)
    span_b = span((r.ts_start, r.ts_end) for r in base_all)
    recent, base = windows(t, rows)
    builds = _builds(recent)
    if span_r <= 0 or builds < MIN_BUILDS:
        return None
    rate_now = builds / span_r
    rate_before = _builds(base) / span_b if span_b > 0 else 0.0
    if rate_now < BUILD_GROWTH * rate_before:
        return None
    pids = frozenset(r.pid for r in recent)
    n_pids = max(1, len(pids))
    # The capture time: host time in the capture and instantiation calls, as a share of
    # the traced processes' wall time (the kernels launched between begin and end are
    # recorded into the graph, not run, so this is what a build costs the step).
    build_ns = sum(r.total_ns for r in recent)
    share = build_ns / (span_r * 1e9 * n_pids)
    share_before = sum(r.total_ns for r in base) / (span_b * 1e9 * n_pids) if span_b > 0 else 0.0
    # Every traced interval, those without a build at 0: a start-up build is one interval
    # among many, not the baseline's typical value.
    built = per_tick(rows, lambda g: float(_builds(g)))
    series = {ts: built.get(ts, 0.0) for ts in sorted({r.ts_end for r in t.ops})}
    base_med = baseline_median(series, t.split, 0.0)
    return Signal(
        id="graph_recapture",
        layer="cuda",
        text=f"{builds:,} CUDA graphs captured and instantiated again ({fmt_rate(rate_now)},"
        f" was {fmt_rate(rate_before)}) in {pids_text(t, pids)}, {fmt_ns(build_ns)} of host"
        f" time ({fmt_pct(share)} of wall time)",
        strength=count_growth(rate_now, rate_before, builds),
        evidence={
            "builds": builds,
            "rate": round(rate_now, 3),
            "rate_baseline": round(rate_before, 3),
            "build_ns": build_ns,
            "share": round(share, 4),
            "share_baseline": round(share_before, 4),
            "ops": sorted({r.op for r in recent}),
            "processes": proc_evidence(t, pids),
        },
        pids=pids,
        onset=onset(series, t.split, max(1.0, base_med * BUILD_GROWTH), True),
        series=series,
    )
