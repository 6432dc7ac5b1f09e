"""CUDA and NCCL call signals: p95 latency up (per kind of call), allocator churn, memcpy."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Final

from ingero.explain.analysis import (
    LATENCY_RATIO,
    MIN_CALLS,
    SHARE_GROWTH,
    TIMES,
    fmt_ns,
    fmt_pct,
    fmt_rate,
)
from ingero.explain.chains.signal import (
    OFFCPU_OP,
    Signal,
    baseline_median,
    count_growth,
    onset,
    per_tick,
    pids_text,
    proc_evidence,
    span,
    weighted_p95,
    windows,
)
from ingero.explain.chains.timeline import OpPoint, Timeline
from ingero.nodedb.ops import (
    GRAPH_BUILD_OPS,
    GRAPH_LAUNCH_OPS,
    LAUNCH_OPS,
    STEP_OPS,
    SYNC_OPS,
)

ALLOC_OPS: Final = ("cudaMalloc", "cudaFree", "cudaMallocManaged", "cuMemAlloc")
ALLOC_GROWTH: Final = 3.0  # allocator calls: a burst, not a few more


def _calls(t: Timeline) -> list[tuple[tuple[str, str], list[OpPoint]]]:
    """The call rows (not steps, not off-CPU time) per (source, op), in that order."""
    by_op: dict[tuple[str, str], list[OpPoint]] = defaultdict(list)
    for r in t.ops:
        if r.op not in STEP_OPS and r.op != OFFCPU_OP:
            by_op[(r.source, r.op)].append(r)
    return sorted(by_op.items())


def _spans(t: Timeline) -> tuple[list[OpPoint], list[OpPoint], float, float]:
    """(recent, baseline) rows of every op but off-CPU time, and the seconds each covers."""
    recent, base = windows(t, [r for r in t.ops if r.op != OFFCPU_OP])
    return (
        recent,
        base,
        span((r.ts_start, r.ts_end) for r in recent),
        span((r.ts_start, r.ts_end) for r in base),
    )


def latency_kind(source: str, op: str) -> str | None:
    if source == "nccl":
        return "nccl_latency"
    if op in LAUNCH_OPS or op in GRAPH_LAUNCH_OPS:
        return "launch_latency"
    if op in SYNC_OPS:
        return "sync_latency"
    if (
        op in ALLOC_OPS
        or op in GRAPH_BUILD_OPS
        or "memcpy" in op.lower()
        or source not in ("cuda_runtime", "cuda_driver")
    ):
        # memcpy, the allocator and graph builds have signals of their own; host rows are
        # not calls
        return None
    return "op_latency"


def _p95_up(t: Timeline, kind: str) -> Signal | None:
    """The call of this kind whose p95 grew the most, by LATENCY_RATIO or more."""
    best: Signal | None = None
    for (source, op), rows in _calls(t):
        if latency_kind(source, op) != kind:
            continue
        recent, base = windows(t, rows)
        n_now, n_before = sum(r.count for r in recent), sum(r.count for r in base)
        p_now, p_before = weighted_p95(recent), weighted_p95(base)
        if min(n_now, n_before) < MIN_CALLS or p_before <= 0 or p_now / p_before < LATENCY_RATIO:
            continue
        pids = frozenset(
            pid
            for pid in {r.pid for r in recent}
            if (b := weighted_p95([r for r in base if r.pid == pid])) > 0
            and weighted_p95([r for r in recent if r.pid == pid]) / b >= LATENCY_RATIO
        ) or frozenset(r.pid for r in recent)
        series = per_tick(rows, weighted_p95)
        base_med = baseline_median(series, t.split, p_before)
        label = f"NCCL {op}" if source == "nccl" else op
        sig = Signal(
            id=kind,
            layer="nccl" if source == "nccl" else "cuda",
            text=f"{label} p95 {p_now / p_before:.1f}{TIMES} ({fmt_ns(p_now)}, was"
            f" {fmt_ns(p_before)}) in {pids_text(t, pids)}",
            strength=math.log2(p_now / p_before),
            evidence={
                "op": op,
                "source": source,
                "calls": n_now,
                "p95_ns": round(p_now),
                "p95_ns_baseline": round(p_before),
                "ratio": round(p_now / p_before, 2),
                "processes": proc_evidence(t, pids),
            },
            pids=pids,
            onset=onset(series, t.split, base_med * LATENCY_RATIO, True),
            series=series,
        )
        if best is None or sig.strength > best.strength:
            best = sig
    return best


def launch_latency(t: Timeline) -> Signal | None:
    """Kernel- or graph-launch calls slower."""
    return _p95_up(t, "launch_latency")


def sync_latency(t: Timeline) -> Signal | None:
    """Synchronisation calls (stream, device, event) slower."""
    return _p95_up(t, "sync_latency")


def op_latency(t: Timeline) -> Signal | None:
    """Any other CUDA runtime or driver call slower."""
    return _p95_up(t, "op_latency")


def nccl_latency(t: Timeline) -> Signal | None:
    """NCCL calls slower."""
    return _p95_up(t, "nccl_latency")


def alloc_churn(t: Timeline) -> Signal | None:
    """An allocator call at ALLOC_GROWTH times its rate or more (the largest such burst)."""
    _, _, span_r, span_b = _spans(t)
    if span_r <= 0 or span_b <= 0:
        return None
    best: Signal | None = None
    for (source, op), rows in _calls(t):
        if op not in ALLOC_OPS:
            continue
        recent, base = windows(t, rows)
        rate_now = sum(r.count for r in recent) / span_r
        rate_before = sum(r.count for r in base) / span_b
        calls = sum(r.count for r in recent)
        if calls < MIN_CALLS or rate_now < ALLOC_GROWTH * rate_before:
            continue
        pids = frozenset(r.pid for r in recent)
        series = per_tick(rows, lambda g: sum(r.count for r in g))
        base_med = baseline_median(series, t.split, 0.0)
        sig = Signal(
            id="alloc_churn",
            layer="cuda",
            text=f"{calls:,} {op} calls ({fmt_rate(rate_now)}, was"
            f" {fmt_rate(rate_before)}) in {pids_text(t, pids)},"
            f" {fmt_ns(sum(r.total_ns for r in recent))} in total",
            strength=count_growth(rate_now, rate_before, calls),
            evidence={
                "op": op,
                "source": source,
                "calls": calls,
                "rate": round(rate_now, 2),
                "rate_baseline": round(rate_before, 2),
                "total_ns": sum(r.total_ns for r in recent),
                "processes": proc_evidence(t, pids),
            },
            pids=pids,
            onset=onset(series, t.split, max(1.0, base_med * ALLOC_GROWTH), True),
            series=series,
        )
        if best is None or sig.strength > best.strength:
            best = sig
    return best


def memcpy(t: Timeline) -> Signal | None:
    """Copies take SHARE_GROWTH more of the traced processes' wall time."""
    recent_all, base_all, span_r, span_b = _spans(t)
    memcpy_now: list[OpPoint] = []
    memcpy_before: list[OpPoint] = []
    for (_, op), rows in _calls(t):
        if "memcpy" in op.lower():
            recent, base = windows(t, rows)
            memcpy_now += recent
            memcpy_before += base
    if not memcpy_now or span_r <= 0 or span_b <= 0:
        return None
    n_pids = max(1, len({r.pid for r in recent_all}))
    share_now = sum(r.total_ns for r in memcpy_now) / (span_r * 1e9 * n_pids)
    n_before_pids = max(1, len({r.pid for r in base_all}))
    share_before = sum(r.total_ns for r in memcpy_before) / (span_b * 1e9 * n_before_pids)
    if share_now - share_before < SHARE_GROWTH:
        return None
    pids = frozenset(r.pid for r in memcpy_now)
    series = per_tick(
        [r for r in t.ops if "memcpy" in r.op.lower()], lambda g: sum(r.total_ns for r in g)
    )
    base_med = baseline_median(series, t.split, 0.0)
    ops = sorted({r.op for r in memcpy_now})
    return Signal(
        id="memcpy",
        layer="cuda",
        text=f"{'/'.join(ops[:3])} {fmt_pct(share_now)} of traced wall time (was"
        f" {fmt_pct(share_before)}), {sum(r.bytes for r in memcpy_now) / 2**20:,.0f}"
        f" MiB in {sum(r.count for r in memcpy_now):,} copies",
        strength=math.log2(max(share_now / max(share_before, 1e-3), 1.0)),
        evidence={
            "ops": ops,
            "share": round(share_now, 4),
            "share_baseline": round(share_before, 4),
            "copies": sum(r.count for r in memcpy_now),
            "bytes": sum(r.bytes for r in memcpy_now),
            "processes": proc_evidence(t, pids),
        },
        pids=pids,
        onset=onset(series, t.split, base_med * (1 + 2 * SHARE_GROWTH) + 1, True),
        series=series,
    )
