"""Host signals: off-CPU time of the traced threads, page allocations, block I/O, retransmits."""

from __future__ import annotations

import math
from typing import Final

from ingero.explain.analysis import SHARE_GROWTH, TIMES, fmt_ns, fmt_rate
from ingero.explain.chains.signal import (
    OFFCPU_OP,
    Signal,
    in_recent,
    median,
    onset,
    per_tick,
    pids_text,
    proc_evidence,
    span,
    windows,
)
from ingero.explain.chains.timeline import HostPoint, Timeline

# Off-CPU time of a busy training process is high at rest (a dataloader's threads sleep a
# lot: about 2 s per second over all threads on a real H100 node), so only growth counts.
OFFCPU_GROWTH: Final = 1.5
HOST_GROWTH: Final = 2.0  # page allocations, block I/O, retransmits: at least doubled


def offcpu(t: Timeline) -> Signal | None:
    """Off-CPU time of the traced processes grew (per process; node-wide without them)."""
    rows = [r for r in t.ops if r.source == "host" and r.op == OFFCPU_OP]
    recent, base = windows(t, rows)
    if not recent or not base:
        return _node_offcpu(t)
    span_r = span((r.ts_start, r.ts_end) for r in recent)
    span_b = span((r.ts_start, r.ts_end) for r in base)
    if span_r <= 0 or span_b <= 0:
        return None
    pids: set[int] = set()
    per_pid = []
    for pid in sorted({r.pid for r in recent}):
        now = [r for r in recent if r.pid == pid]
        before = [r for r in base if r.pid == pid]
        t_now = sum(r.total_ns for r in now) / span_r
        t_before = sum(r.total_ns for r in before) / span_b
        n_now = sum(r.count for r in now) / span_r
        n_before = sum(r.count for r in before) / span_b
        grew_time = t_before > 0 and t_now / t_before >= OFFCPU_GROWTH
        grew_count = n_before > 0 and n_now / n_before >= OFFCPU_GROWTH
        if (grew_time or grew_count) and t_now - t_before >= SHARE_GROWTH * 1e9:
            pids.add(pid)
            per_pid.append((pid, now, t_now, t_before, n_now, n_before))
    if not pids:
        return None
    switches = sum(sum(r.count for r in now) for _, now, *_ in per_pid)
    off_ns = sum(sum(r.total_ns for r in now) for _, now, *_ in per_pid)
    frac_now = sum(p[2] for p in per_pid) / 1e9
    frac_before = sum(p[3] for p in per_pid) / 1e9
    rate_now, rate_before = sum(p[4] for p in per_pid), sum(p[5] for p in per_pid)
    series = per_tick([r for r in rows if r.pid in pids], lambda g: sum(r.total_ns for r in g))
    base_vals = [v for ts, v in series.items() if ts <= t.split]
    ratio = frac_now / frac_before if frac_before > 0 else rate_now / max(rate_before, 1e-9)
    return Signal(
        id="offcpu",
        layer="host",
        text=(
            f"{switches:,} off-CPU switches of the threads of {pids_text(t, pids)}"
            f" ({fmt_rate(rate_now)}, was {fmt_rate(rate_before)}), off-CPU"
            f" {frac_now:.3g} s/s (was {frac_before:.3g} s/s)"
        ),
        strength=math.log2(max(ratio, 1.0)),
        evidence={
            "switches": switches,
            "offcpu_s": round(off_ns / 1e9, 3),
            "switch_rate": round(rate_now, 2),
            "switch_rate_baseline": round(rate_before, 2),
            "offcpu_fraction": round(frac_now, 4),
            "offcpu_fraction_baseline": round(frac_before, 4),
            "processes": proc_evidence(t, pids),
            "source": "intervals (source host, op offcpu: sched_switch)",
        },
        pids=frozenset(pids),
        onset=onset(series, t.split, (median(base_vals) or 0.0) * OFFCPU_GROWTH, True),
        series=series,
    )


def _node_offcpu(t: Timeline) -> Signal | None:
    """Node-wide off-CPU time (host_intervals) when no per-process rows exist."""
    recent, base, span_r, span_b = _host_windows(t)
    if span_r <= 0 or span_b <= 0:
        return None
    now = sum(h.offcpu_ns for h in recent) / span_r / 1e9
    before = sum(h.offcpu_ns for h in base) / span_b / 1e9
    if before <= 0 or now / before < OFFCPU_GROWTH or now - before < SHARE_GROWTH:
        return None
    series = {h.ts_end: float(h.offcpu_ns) for h in t.host}
    base_vals = [h.offcpu_ns for h in base]
    return Signal(
        id="offcpu",
        layer="host",
        text=f"off-CPU time of traced threads {now:.3g} s/s (was {before:.3g} s/s)",
        strength=math.log2(now / before),
        evidence={
            "offcpu_fraction": round(now, 4),
            "offcpu_fraction_baseline": round(before, 4),
            "source": "host_intervals.offcpu_ns",
        },
        pids=None,
        onset=onset(series, t.split, (median(base_vals) or 0.0) * OFFCPU_GROWTH, True),
        series=series,
    )


def _host_windows(t: Timeline) -> tuple[list[HostPoint], list[HostPoint], float, float]:
    """(recent, baseline) host rows and the seconds each covers."""
    recent = [h for h in t.host if in_recent(h.ts_end, t)]
    base = [h for h in t.host if not in_recent(h.ts_end, t)]
    return (
        recent,
        base,
        span((h.ts_start, h.ts_end) for h in recent),
        span((h.ts_start, h.ts_end) for h in base),
    )


def _rate(rows: list[HostPoint], attr: str, seconds: float) -> float:
    return sum(getattr(h, attr) for h in rows) / seconds if seconds > 0 else 0.0


def page_allocs(t: Timeline) -> Signal | None:
    """Page allocations (kmem:mm_page_alloc) at least doubled."""
    recent, base, span_r, span_b = _host_windows(t)
    if span_r <= 0:
        return None
    now, before = _rate(recent, "page_allocs", span_r), _rate(base, "page_allocs", span_b)
    if before <= 0 or now / before < HOST_GROWTH:
        return None
    series = {h.ts_end: float(h.page_allocs) for h in t.host}
    return Signal(
        id="page_allocs",
        layer="host",
        text=f"page allocations {now / before:.1f}{TIMES}"
        f" ({fmt_rate(now)}, was {fmt_rate(before)})",
        strength=math.log2(now / before),
        evidence={
            "pages": sum(h.page_allocs for h in recent),
            "rate": round(now, 1),
            "rate_baseline": round(before, 1),
            "source": "host_intervals.page_allocs (kmem:mm_page_alloc)",
        },
        pids=None,
        onset=onset(
            series, t.split, (median(h.page_allocs for h in base) or 0.0) * HOST_GROWTH, True
        ),
        series=series,
    )


def block_io(t: Timeline) -> Signal | None:
    """Block I/O p99 at least doubled, or twice the requests at no lower p99."""
    recent, base, span_r, span_b = _host_windows(t)
    if span_r <= 0:
        return None
    p99_now = max((h.block_io_p99_ns or 0 for h in recent), default=0)
    p99_before = max((h.block_io_p99_ns or 0 for h in base), default=0)
    io_now = _rate(recent, "block_io_count", span_r)
    io_before = _rate(base, "block_io_count", span_b)
    slower = p99_before > 0 and p99_now / p99_before >= HOST_GROWTH
    more = io_before > 0 and io_now / io_before >= HOST_GROWTH and p99_now >= p99_before
    if not (slower or (more and p99_now > 0)):
        return None
    series = {h.ts_end: float(h.block_io_p99_ns or 0) for h in t.host}
    ratio = p99_now / p99_before if slower else io_now / io_before
    return Signal(
        id="block_io",
        layer="host",
        text=f"block I/O p99 {fmt_ns(p99_now)} (was {fmt_ns(p99_before)}),"
        f" {fmt_rate(io_now)} requests (was {fmt_rate(io_before)})",
        strength=math.log2(ratio),
        evidence={
            "p99_ns": p99_now,
            "p99_ns_baseline": p99_before,
            "requests": sum(h.block_io_count for h in recent),
            "rate": round(io_now, 2),
            "rate_baseline": round(io_before, 2),
            "source": "host_intervals (block:block_rq_issue/complete)",
        },
        pids=None,
        onset=onset(series, t.split, max(p99_before, 1) * (HOST_GROWTH if slower else 1), True),
        series=series,
    )


def tcp_retransmits(t: Timeline) -> Signal | None:
    """TCP retransmits appeared, or their rate at least doubled."""
    recent, base, span_r, span_b = _host_windows(t)
    if span_r <= 0:
        return None
    now = sum(h.tcp_retransmits for h in recent)
    before = sum(h.tcp_retransmits for h in base)
    rate_before = before / span_b if span_b > 0 else 0.0
    if not now or now / span_r < HOST_GROWTH * rate_before:
        return None
    series = {h.ts_end: float(h.tcp_retransmits) for h in t.host}
    return Signal(
        id="tcp_retransmits",
        layer="host",
        text=f"{now:,} TCP retransmits (was {before:,})",
        strength=math.log2(1 + now / max(before, 1)),
        evidence={
            "retransmits": now,
            "retransmits_baseline": before,
            "source": "host_intervals.tcp_retransmits (tcp:tcp_retransmit_skb)",
        },
        pids=None,
        onset=onset(
            series,
            t.split,
            max(1.0, HOST_GROWTH * (median(h.tcp_retransmits for h in base) or 0.0)),
            True,
        ),
        series=series,
    )
