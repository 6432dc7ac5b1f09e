"""The effect every chain ends in: the node's throughput dropped."""

from __future__ import annotations

import math
from typing import Final

from ingero.explain.analysis import RATE_DROP, fmt_pct, fmt_rate
from ingero.explain.chains.signal import (
    Signal,
    baseline_median,
    in_recent,
    onset,
    per_tick,
    proc_evidence,
    span,
    windows,
)
from ingero.explain.chains.timeline import GpuPoint, Timeline
from ingero.nodedb.ops import GRAPH_LAUNCH_OPS, LAUNCH_OPS, STEP_OPS

GPU_BUSY_DROP: Final = 0.10


def throughput_drop(t: Timeline) -> Signal | None:
    """Graph-launch rate (where the job replays CUDA graphs), else kernel-launch rate, else
    step rate, else GPU busy: down by RATE_DROP or more."""
    for names, label in (
        (GRAPH_LAUNCH_OPS, "graph-launch rate"),
        (LAUNCH_OPS, "kernel-launch rate"),
        (STEP_OPS, "step rate"),
    ):
        rows = [r for r in t.ops if r.op in names]
        recent, base = windows(t, rows)
        span_r = span((r.ts_start, r.ts_end) for r in recent)
        span_b = span((r.ts_start, r.ts_end) for r in base)
        if span_r <= 0 or span_b <= 0:
            continue
        now = sum(r.count for r in recent) / span_r
        before = sum(r.count for r in base) / span_b
        if before <= 0 or now / before > 1.0 - RATE_DROP:
            # The rate did not drop, or this row kind is absent; kernel launches stand
            # for the work only where no graph is replayed, a step source only where no
            # launch is traced.
            if before > 0:
                return None
            continue
        pids = set()
        for pid in {r.pid for r in base}:
            b = sum(r.count for r in base if r.pid == pid) / span_b
            n = sum(r.count for r in recent if r.pid == pid) / span_r
            if b > 0 and n / b <= 1.0 - RATE_DROP:
                pids.add(pid)
        series = per_tick(
            rows,
            lambda g: (
                sum(r.count for r in g)
                / max(1e-9, max(r.ts_end for r in g) - min(r.ts_start for r in g))
            ),
        )
        base_med = baseline_median(series, t.split, before)
        return Signal(
            id="throughput_drop",
            layer="throughput",
            text=f"{label} down {fmt_pct(1 - now / before)} ({fmt_rate(now)},"
            f" was {fmt_rate(before)})",
            strength=-math.log2(max(now / before, 1e-3)),
            evidence={
                "metric": label,
                "rate": round(now, 2),
                "rate_baseline": round(before, 2),
                "drop": round(1 - now / before, 4),
                "processes": proc_evidence(t, pids),
            },
            pids=frozenset(pids) or None,
            onset=onset(series, t.split, base_med * (1.0 - RATE_DROP), False),
            series=series,
            rising=False,
        )
    return _gpu_busy_drop(t)


def _busy(rows: list[GpuPoint]) -> float:
    seconds = sum(g.ts_end - g.ts_start for g in rows)
    return sum(g.busy_ns or 0 for g in rows) / 1e9 / seconds if seconds > 0 else 0.0


def _gpu_busy_drop(t: Timeline) -> Signal | None:
    """GPU busy down by GPU_BUSY_DROP or more (no launch or step rows to measure)."""
    g_recent = [g for g in t.gpus if in_recent(g.ts_end, t) and g.busy_ns is not None]
    g_base = [g for g in t.gpus if not in_recent(g.ts_end, t) and g.busy_ns is not None]
    if not g_recent or not g_base or _busy(g_base) - _busy(g_recent) < GPU_BUSY_DROP:
        return None
    now, before = _busy(g_recent), _busy(g_base)
    series = {
        ts: _busy([g for g in t.gpus if g.ts_end == ts and g.busy_ns is not None])
        for ts in sorted({g.ts_end for g in t.gpus})
    }
    base_med = baseline_median(series, t.split, before)
    return Signal(
        id="throughput_drop",
        layer="throughput",
        text=f"GPU busy {fmt_pct(now)} (was {fmt_pct(before)})",
        strength=-math.log2(max(now / before, 1e-3)) if before > 0 else 1.0,
        evidence={
            "metric": "GPU busy",
            "busy": round(now, 4),
            "busy_baseline": round(before, 4),
        },
        pids=None,
        onset=onset(series, t.split, base_med - GPU_BUSY_DROP, False),
        series=series,
        rising=False,
    )
