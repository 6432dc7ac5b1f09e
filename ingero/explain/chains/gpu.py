"""GPU signals: throttling and XID errors (NVML, where the node DB records them)."""

from __future__ import annotations

from collections.abc import Callable

from ingero.explain.analysis import SHARE_GROWTH, fmt_pct
from ingero.explain.chains.signal import Signal, in_recent
from ingero.explain.chains.timeline import GpuPoint, Timeline


def _count_per_tick(t: Timeline, hit: Callable[[GpuPoint], bool]) -> dict[float, float]:
    """How many GPUs were ``hit`` in each interval, over both windows."""
    return {
        ts: float(sum(1 for g in t.gpus if g.ts_end == ts and hit(g)))
        for ts in sorted({g.ts_end for g in t.gpus})
    }


def gpu_throttle(t: Timeline) -> Signal | None:
    """A larger share of the recent GPU intervals is throttled than of the baseline's."""
    recent = [g for g in t.gpus if in_recent(g.ts_end, t)]
    base = [g for g in t.gpus if not in_recent(g.ts_end, t)]
    throttled = [g for g in recent if g.throttled]
    if not throttled:
        return None
    share_now = len(throttled) / len(recent)
    share_before = sum(1 for g in base if g.throttled) / len(base) if base else 0.0
    if share_now - share_before < SHARE_GROWTH:
        return None
    gpus = sorted({g.gpu for g in throttled})
    reasons = sorted({g.throttle_detail for g in throttled if g.throttle_detail})
    series = _count_per_tick(t, lambda g: g.throttled)
    return Signal(
        id="gpu_throttle",
        layer="gpu",
        text=f"GPU {', '.join(map(str, gpus))} throttled in {fmt_pct(share_now)} of"
        f" intervals (was {fmt_pct(share_before)})"
        + (f": {', '.join(reasons[:3])}" if reasons else ""),
        strength=1.0 + 3.0 * (share_now - share_before),
        evidence={
            "gpus": gpus,
            "throttled_intervals": len(throttled),
            "intervals": len(recent),
            "reasons": reasons,
            "first": min(g.ts_end for g in throttled),
            "source": "gpu_intervals (NVML throttle reasons)",
        },
        pids=None,
        onset=min(g.ts_end for g in throttled),
        series=series,
    )


def gpu_xid(t: Timeline) -> Signal | None:
    """An XID error in the recent window, none in the baseline."""
    recent = [g for g in t.gpus if in_recent(g.ts_end, t)]
    base = [g for g in t.gpus if not in_recent(g.ts_end, t)]
    xids = [g for g in recent if g.xid]
    if not xids or any(g.xid for g in base):
        return None
    series = _count_per_tick(t, lambda g: bool(g.xid))
    return Signal(
        id="gpu_xid",
        layer="gpu",
        text=f"XID {', '.join(str(x) for x in sorted({g.xid for g in xids if g.xid}))} on GPU"
        f" {', '.join(str(g) for g in sorted({g.gpu for g in xids}))}",
        strength=3.0,
        evidence={
            "xids": sorted({g.xid for g in xids if g.xid}),
            "gpus": sorted({g.gpu for g in xids}),
            "first": min(g.ts_end for g in xids),
            "source": "gpu_intervals (NVML XID events)",
        },
        pids=None,
        onset=min(g.ts_end for g in xids),
        series=series,
    )
