"""Why this node may be slow: compare a recent window of the node DB with the one before it.

Pure: takes the two windows as plain values (``WindowData``) and returns ranked findings.
Each finding carries a severity used only for ordering: the size of the change on a log
scale (a halving counts as much as a doubling), weighted by how much that thing matters to
a training step (the kernel-launch rate is the node's throughput signal, so it weighs most).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ingero.nodedb.ops import GRAPH_LAUNCH_OPS, LAUNCH_OPS, STEP_OPS, SYNC_OPS

# Below this many calls a percentile says little; such ops are listed but not compared.
MIN_CALLS: Final = 10
# A change smaller than this (as a ratio) is within normal noise.
LATENCY_RATIO: Final = 1.5
RATE_DROP: Final = 0.10
SHARE_GROWTH: Final = 0.05
GPU_BUSY_DROP: Final = 0.10
LOW_FREE_MEMORY: Final = 0.10
OFFCPU_HIGH: Final = 0.20
TIMES: Final = "\N{MULTIPLICATION SIGN}"


@dataclass(frozen=True)
class OpStats:
    """One (source, op) over a window; percentiles are count-weighted means per interval."""

    source: str
    op: str
    count: int
    total_ns: int
    p50_ns: float
    p95_ns: float
    p99_ns: float
    errors: int = 0


@dataclass(frozen=True)
class HostStats:
    covered_s: float
    offcpu_ns: int
    page_allocs: int
    block_io_count: int
    block_io_p99_ns: int | None
    tcp_retransmits: int
    dropped_events: int


@dataclass(frozen=True)
class GpuStats:
    gpu: int
    busy_fraction: float | None
    mem_free_bytes: int | None  # the least free in the window
    mem_total_bytes: int | None
    # Hardware health as NVML reported it in the window (None/empty: not measured).
    throttled_fraction: float | None = None  # share of samples with a hardware slowdown
    throttle_reasons: tuple[str, ...] = ()
    xids: tuple[int, ...] = ()
    ecc_uncorrected_new: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    lost: bool = False
    health_measured: bool = False


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    comm: str | None
    job_id: str | None
    rank: int | None
    last_seen: float | None


@dataclass(frozen=True)
class WindowData:
    start: float
    end: float
    covered_s: float  # time the window's interval rows cover
    pids: int
    ops: tuple[OpStats, ...] = ()
    host: HostStats | None = None
    gpus: tuple[GpuStats, ...] = ()
    busy_source: str | None = None  # "gpu_intervals" (measured) or None
    # Host time in synchronize calls ÷ wall: a lower bound of GPU busy, shown as an estimate
    # only where nothing measured GPU busy (the score never uses it).
    sync_busy_estimate: float | None = None

    @property
    def empty(self) -> bool:
        return not self.ops and self.host is None and not self.gpus

    def op(self, source: str, op: str) -> OpStats | None:
        return next((o for o in self.ops if o.source == source and o.op == op), None)

    def calls(self, names: tuple[str, ...]) -> int:
        return sum(o.count for o in self.ops if o.op in names)

    def rate(self, names: tuple[str, ...]) -> float | None:
        return self.calls(names) / self.covered_s if self.covered_s > 0 else None

    def share(self, ops: list[OpStats]) -> float | None:
        """Time in ``ops`` as a fraction of the traced processes' wall time."""
        wall_ns = self.covered_s * 1e9 * max(1, self.pids)
        return sum(o.total_ns for o in ops) / wall_ns if wall_ns > 0 else None

    @property
    def gpu_busy(self) -> float | None:
        values = [g.busy_fraction for g in self.gpus if g.busy_fraction is not None]
        return sum(values) / len(values) if values else None


@dataclass(frozen=True)
class Finding:
    severity: float
    kind: str
    subject: str
    message: str
    recent: float | None = None
    baseline: float | None = None
    # What a finding names beyond its message (a hung collective: its call and stack).
    evidence: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        out = {
            "severity": round(self.severity, 3),
            "kind": self.kind,
            "subject": self.subject,
            "message": self.message,
            "recent": self.recent,
            "baseline": self.baseline,
        }
        return out if self.evidence is None else {**out, "evidence": self.evidence}


@dataclass(frozen=True)
class OpRow:
    source: str
    op: str
    count: int
    p50_ns: float
    p95_ns: float
    p99_ns: float
    share: float | None
    errors: int
    baseline_p95_ns: float | None
    baseline_share: float | None

    @property
    def p95_ratio(self) -> float | None:
        if self.baseline_p95_ns is None or self.baseline_p95_ns <= 0 or self.p95_ns <= 0:
            return None
        return self.p95_ns / self.baseline_p95_ns


@dataclass(frozen=True)
class Report:
    window_s: float
    job_id: str | None
    recent: WindowData
    baseline: WindowData
    findings: list[Finding]
    ops: list[OpRow]
    summary: dict[str, float | str | None]
    processes: list[ProcessInfo] = field(default_factory=list)


def fmt_ns(ns: float) -> str:
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.0f} ns"


def fmt_rate(per_s: float) -> str:
    return f"{per_s:,.0f}/s" if per_s >= 100 else f"{per_s:.3g}/s"


def fmt_window(seconds: float) -> str:
    for unit, scale in (("h", 3600), ("min", 60)):
        if seconds >= scale and seconds % scale == 0:
            return f"{seconds / scale:g} {unit}"
    return f"{seconds:g} s"


def fmt_pct(fraction: float) -> str:
    return f"{100 * fraction:.0f}%"


def _log2(ratio: float) -> float:
    return abs(math.log2(ratio)) if ratio > 0 else 0.0


def _is_memcpy(op: str) -> bool:
    return "memcpy" in op.lower()


def _rate_findings(recent: WindowData, base: WindowData, vs: str) -> list[Finding]:
    out = []
    for kind, names, label, weight in (
        ("launch_rate", LAUNCH_OPS, "kernel-launch rate", 3.0),
        # CUDA graph replays: a job's whole step where it replays graphs.
        ("graph_launch_rate", GRAPH_LAUNCH_OPS, "graph-launch rate", 3.0),
        ("step_rate", STEP_OPS, "step rate", 3.0),
    ):
        now, before = recent.rate(names), base.rate(names)
        if now is None or not before:
            continue
        ratio = now / before
        if ratio <= 1.0 - RATE_DROP:
            out.append(
                Finding(
                    weight * _log2(max(ratio, 1e-3)) + 1.0,
                    kind,
                    label,
                    f"{label} down {fmt_pct(1 - ratio)} {vs} ({fmt_rate(now)}, was {fmt_rate(before)})",
                    now,
                    before,
                )
            )
    return out


def _op_findings(recent: WindowData, base: WindowData, vs: str) -> list[Finding]:
    out = []
    for o in recent.ops:
        if o.op in STEP_OPS:
            continue
        b = base.op(o.source, o.op)
        share = recent.share([o]) or 0.0
        base_share = base.share([b]) if b is not None else None
        label = f"NCCL {o.op}" if o.source == "nccl" else o.op
        weight = 1.5 if o.source == "nccl" else 1.0
        if b is not None and min(o.count, b.count) >= MIN_CALLS and b.p95_ns > 0:
            ratio = o.p95_ns / b.p95_ns
            if ratio >= LATENCY_RATIO:
                out.append(
                    Finding(
                        weight * _log2(ratio) * (0.5 + min(1.0, share)),
                        "nccl_latency" if o.source == "nccl" else "op_latency",
                        o.op,
                        f"{label} p95 up {ratio:.1f}{TIMES} {vs} ({fmt_ns(o.p95_ns)},"
                        f" was {fmt_ns(b.p95_ns)})",
                        o.p95_ns,
                        b.p95_ns,
                    )
                )
        if base_share is not None and share - base_share >= SHARE_GROWTH:
            out.append(
                Finding(
                    4.0 * (share - base_share),
                    "op_share",
                    o.op,
                    f"{label} {fmt_pct(share)} of traced wall time (was {fmt_pct(base_share)})",
                    share,
                    base_share,
                )
            )
        if o.errors:
            before = b.errors / base.covered_s if b is not None and base.covered_s > 0 else 0.0
            now_rate = o.errors / recent.covered_s if recent.covered_s > 0 else 0.0
            new = before <= 0 or now_rate >= 1.5 * before
            was = f"was {b.errors}" if b is not None else "none before"
            out.append(
                Finding(
                    (1.0 + math.log10(o.errors)) if new else 0.3,
                    "errors",
                    o.op,
                    f"{label} returned an error {o.errors:,} times ({was})",
                    float(o.errors),
                    float(b.errors) if b is not None else None,
                )
            )
    return out


def _wait_share(window: WindowData) -> float | None:
    return window.share([o for o in window.ops if o.op in SYNC_OPS or _is_memcpy(o.op)])


def _wait_findings(recent: WindowData, base: WindowData) -> list[Finding]:
    now, before = _wait_share(recent), _wait_share(base)
    if not now:
        return []
    grew = before is not None and now - before >= 2 * SHARE_GROWTH
    if not (grew or (before is None and now >= 0.5)):
        return []
    was = f" (was {fmt_pct(before)})" if before is not None else ""
    return [
        Finding(
            2.0 * now + (3.0 * (now - before) if before is not None else 0.0),
            "sync_share",
            "sync/memcpy",
            f"sync/memcpy waits {fmt_pct(now)} of traced wall time{was}",
            now,
            before,
        )
    ]


def _gpu_findings(recent: WindowData, base: WindowData) -> list[Finding]:
    out = []
    if not recent.gpus:
        if recent.ops:
            estimate = recent.sync_busy_estimate
            guess = (
                f"; sync-time estimate at least {fmt_pct(estimate)} (an estimate, not used in"
                " the score)"
                if estimate is not None
                else ""
            )
            out.append(
                Finding(
                    0.2,
                    "no_gpu",
                    "GPU",
                    "no GPU samples in the window (`ingero trace` or `ingero gpu-sample`"
                    f" writes them): GPU busy, memory and health not measured{guess}",
                    estimate,
                )
            )
        return out
    now, before = recent.gpu_busy, base.gpu_busy
    if now is not None and before is not None and before - now >= GPU_BUSY_DROP:
        out.append(
            Finding(
                5.0 * (before - now),
                "gpu_busy",
                "GPU",
                f"GPU busy {fmt_pct(now)} (was {fmt_pct(before)})",
                now,
                before,
            )
        )
    elif now is not None and before is None and now < 0.5:
        out.append(
            Finding(2.0 * (0.5 - now), "gpu_busy", "GPU", f"GPU busy only {fmt_pct(now)}", now)
        )
    # A GPU full since the baseline is the job's normal (a caching allocator keeps what it
    # reserved, an engine takes its pool at start), not news: only memory that ran low
    # since then is a finding.
    was_free = {g.gpu: _free(g) for g in base.gpus}
    for g in recent.gpus:
        out += _gpu_health_findings(g)
        free, before = _free(g), was_free.get(g.gpu)
        if free is None or free >= LOW_FREE_MEMORY:
            continue
        if before is not None and before < LOW_FREE_MEMORY:
            continue
        was = f", was {fmt_pct(before)}" if before is not None else ""
        out.append(
            Finding(
                0.5 + 20.0 * (LOW_FREE_MEMORY - free),
                "gpu_memory",
                f"GPU {g.gpu}",
                f"GPU {g.gpu} free memory {(g.mem_free_bytes or 0) / 2**30:.1f} GiB of"
                f" {(g.mem_total_bytes or 0) / 2**30:.0f} GiB ({fmt_pct(free)}{was})",
                free,
                before,
            )
        )
    return out


def _free(g: GpuStats) -> float | None:
    """The GPU's least free memory in the window, as a fraction of its total."""
    if g.mem_free_bytes is None or not g.mem_total_bytes:
        return None
    return g.mem_free_bytes / g.mem_total_bytes


def _gpu_health_findings(g: GpuStats) -> list[Finding]:
    """What NVML said about the GPU's hardware: lost, XIDs, ECC, row remapping, throttling."""
    subject = f"GPU {g.gpu}"
    if g.lost:
        return [Finding(8.0, "gpu_lost", subject, f"{subject} is lost (NVML: GPU_IS_LOST)")]
    out = []
    if g.xids:
        codes = ", ".join(str(x) for x in g.xids)
        out.append(Finding(6.0, "gpu_xid", subject, f"{subject} logged XID {codes}"))
    if g.ecc_uncorrected_new:
        out.append(
            Finding(
                6.0,
                "gpu_ecc",
                subject,
                f"{subject}: {g.ecc_uncorrected_new} new uncorrected ECC errors",
                float(g.ecc_uncorrected_new),
            )
        )
    if g.remap_failure or g.remap_pending:
        what = "a row remapping failed" if g.remap_failure else "a row remapping is pending"
        out.append(Finding(4.0, "gpu_ecc", subject, f"{subject}: {what} (needs a GPU reset)"))
    if g.throttled_fraction:
        out.append(
            Finding(
                1.0 + 3.0 * g.throttled_fraction,
                "gpu_throttle",
                subject,
                f"{subject} slowed by its hardware {fmt_pct(g.throttled_fraction)} of the"
                f" time ({', '.join(g.throttle_reasons)})",
                g.throttled_fraction,
            )
        )
    return out


def _per_s(count: int, host: HostStats | None) -> float | None:
    return count / host.covered_s if host is not None and host.covered_s > 0 else None


def _host_findings(recent: WindowData, base: WindowData, vs: str) -> list[Finding]:
    h, b = recent.host, base.host
    if h is None:
        return []
    out = []
    if h.covered_s > 0:
        now = h.offcpu_ns / (h.covered_s * 1e9)
        before = b.offcpu_ns / (b.covered_s * 1e9) if b is not None and b.covered_s > 0 else None
        growth = now - before if before is not None else 0.0
        # Summed over all traced threads, off-CPU time is routinely above wall time on a
        # healthy node (a PyTorch loop: ~2 s per s): a level stands out only with nothing to
        # compare it with; otherwise its growth does.
        high = before is None and now >= OFFCPU_HIGH
        if high or growth >= 2 * SHARE_GROWTH:
            was = f" (was {fmt_pct(before)})" if before is not None else ""
            out.append(
                Finding(
                    2.0 * now + 3.0 * max(0.0, growth),
                    "offcpu",
                    "host",
                    f"off-CPU time of traced threads {fmt_pct(now)} of wall{was}",
                    now,
                    before,
                )
            )
    allocs_now, allocs_before = _per_s(h.page_allocs, h), _per_s(b.page_allocs, b) if b else None
    if allocs_now and allocs_before and allocs_now / allocs_before >= 2.0:
        out.append(
            Finding(
                0.5 * _log2(allocs_now / allocs_before),
                "page_allocs",
                "host",
                f"page allocations {allocs_now / allocs_before:.1f}{TIMES} {vs}"
                f" ({fmt_rate(allocs_now)}, was {fmt_rate(allocs_before)})",
                allocs_now,
                allocs_before,
            )
        )
    io_before = b.block_io_p99_ns if b is not None else None
    if h.block_io_p99_ns and io_before and h.block_io_p99_ns / io_before >= 2.0:
        out.append(
            Finding(
                0.7 * _log2(h.block_io_p99_ns / io_before),
                "block_io",
                "host",
                f"block I/O p99 {fmt_ns(h.block_io_p99_ns)} (was {fmt_ns(io_before)})",
                float(h.block_io_p99_ns),
                float(io_before),
            )
        )
    retx_before = b.tcp_retransmits if b is not None else 0
    if h.tcp_retransmits and (not retx_before or h.tcp_retransmits >= 2 * retx_before):
        out.append(
            Finding(
                0.5 + 0.5 * math.log10(1 + h.tcp_retransmits),
                "tcp_retransmits",
                "host",
                f"{h.tcp_retransmits:,} TCP retransmits (was {retx_before:,})",
                float(h.tcp_retransmits),
                float(retx_before),
            )
        )
    if h.dropped_events:
        out.append(
            Finding(
                0.4,
                "dropped",
                "trace",
                f"{h.dropped_events:,} trace samples dropped: the figures above undercount",
                float(h.dropped_events),
            )
        )
    return out


def op_rows(recent: WindowData, base: WindowData) -> list[OpRow]:
    """Every op of the recent window, the most time-consuming first."""
    rows = []
    for o in sorted(recent.ops, key=lambda o: (-o.total_ns, o.op)):
        b = base.op(o.source, o.op)
        rows.append(
            OpRow(
                source=o.source,
                op=o.op,
                count=o.count,
                p50_ns=o.p50_ns,
                p95_ns=o.p95_ns,
                p99_ns=o.p99_ns,
                share=recent.share([o]),
                errors=o.errors,
                baseline_p95_ns=b.p95_ns if b is not None and b.count >= MIN_CALLS else None,
                baseline_share=base.share([b]) if b is not None else None,
            )
        )
    return rows


def _not_measured(window: WindowData) -> list[str]:
    """What the node DB could not tell for the window: left out of the score, never guessed."""
    out = []
    if window.rate(LAUNCH_OPS) is None:
        out.append("kernel_launch_rate")
    if window.calls(STEP_OPS) == 0:
        out.append("step_rate")
    if window.gpu_busy is None:
        out.append("gpu_busy")
    if not any(g.health_measured for g in window.gpus):
        out.append("gpu_health")
    return out


def explain(
    recent: WindowData,
    baseline: WindowData,
    window_s: float,
    job_id: str | None = None,
    processes: list[ProcessInfo] | None = None,
    also: Sequence[Finding] = (),
) -> Report:
    """Ranked findings for ``recent`` against ``baseline`` (the window just before it), with
    ``also`` (findings about the window's end rather than a change: a hung collective)."""
    vs = f"vs the previous {fmt_window(window_s)}"
    findings: list[Finding] = list(also)
    if not recent.empty and baseline.empty:
        findings.append(
            Finding(
                0.1,
                "no_baseline",
                "baseline",
                f"nothing recorded in the previous {fmt_window(window_s)}: no changes to compare",
            )
        )
    findings += _rate_findings(recent, baseline, vs)
    findings += _op_findings(recent, baseline, vs)
    findings += _wait_findings(recent, baseline)
    findings += _gpu_findings(recent, baseline)
    findings += _host_findings(recent, baseline, vs)
    findings.sort(key=lambda f: (-f.severity, f.kind, f.subject))
    wait = _wait_share(recent)
    offcpu = (
        recent.host.offcpu_ns / (recent.host.covered_s * 1e9)
        if recent.host is not None and recent.host.covered_s > 0
        else None
    )
    summary: dict[str, float | str | None] = {
        "kernel_launch_rate": recent.rate(LAUNCH_OPS),
        "kernel_launch_rate_baseline": baseline.rate(LAUNCH_OPS),
        # None where the job replays no CUDA graph.
        "graph_launch_rate": recent.rate(GRAPH_LAUNCH_OPS)
        if recent.calls(GRAPH_LAUNCH_OPS)
        else None,
        "graph_launch_rate_baseline": (
            baseline.rate(GRAPH_LAUNCH_OPS) if baseline.calls(GRAPH_LAUNCH_OPS) else None
        ),
        "step_rate": recent.rate(STEP_OPS) if recent.calls(STEP_OPS) else None,
        "sync_memcpy_share": wait,
        "gpu_busy_fraction": recent.gpu_busy,
        "gpu_busy_source": recent.busy_source,
        # Only where GPU busy was not measured; never a score input.
        "gpu_busy_estimate_sync": None if recent.gpus else recent.sync_busy_estimate,
        "not_measured": ", ".join(_not_measured(recent)) or None,
        "offcpu_fraction": offcpu,
    }
    return Report(
        window_s=window_s,
        job_id=job_id,
        recent=recent,
        baseline=baseline,
        findings=findings,
        ops=op_rows(recent, baseline),
        summary=summary,
        processes=list(processes or ()),
    )
