"""Causal chains: link what changed on the host, the GPU and in CUDA/NCCL to the throughput drop.

Pure: takes a ``Timeline`` (per-interval rows of the recent window and the one before it,
as plain values) and the rule table (``rules.yaml``, data), returns ranked ``Chain``s.

1. Signals: each thing that changed between the two windows (off-CPU time of the traced
   threads, block I/O, page allocations, TCP retransmits, GPU throttle/XID, CUDA call
   latencies, memcpy and allocator time, NCCL latency, peer lag, the throughput drop),
   with its evidence (counts, times, PIDs, comm), the PIDs it concerns (None: node-wide),
   its onset (the first recent interval past the baseline) and its per-interval series.
2. Links: a cause and the signal it leads to line up *in time* (the cause starts no later
   than one interval after the effect, and the per-interval series move together) and
   *by process* (the same PIDs, where both are per-process). Each link gets a confidence.
3. Chains: one per rule of the table whose cause is present, ordered cause -> via ->
   effect, with confidence ``prior x weakest link`` and the rule's fix hint.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Final

import yaml

from ingero.collectors.nodedb import LAUNCH_OPS, STEP_OPS, SYNC_OPS
from ingero.errors import ConfigError
from ingero.explain.analysis import (
    LATENCY_RATIO,
    MIN_CALLS,
    RATE_DROP,
    SHARE_GROWTH,
    TIMES,
    fmt_ns,
    fmt_pct,
    fmt_rate,
)

ALLOC_OPS: Final = ("cudaMalloc", "cudaFree", "cudaMallocManaged", "cuMemAlloc")
OFFCPU_OP: Final = "offcpu"
# Off-CPU time of a busy training process is high at rest (a dataloader's threads sleep a
# lot: about 2 s per second over all threads on a real H100 node), so only growth counts.
OFFCPU_GROWTH: Final = 1.5
HOST_GROWTH: Final = 2.0  # page allocations, block I/O, retransmits: at least doubled
ALLOC_GROWTH: Final = 3.0  # allocator calls: a burst, not a few more
GPU_BUSY_DROP: Final = 0.10
# A rank that reaches this share of a communicator's aligned collectives last lags.
PEER_LAST_SHARE: Final = 0.6
PEER_MIN_LAG_NS: Final = 1_000_000
PEER_MIN_ROUNDS: Final = 5

SIGNALS: Final = (
    "offcpu",
    "block_io",
    "page_allocs",
    "tcp_retransmits",
    "gpu_throttle",
    "gpu_xid",
    "launch_latency",
    "sync_latency",
    "op_latency",
    "memcpy",
    "alloc_churn",
    "nccl_latency",
    "peer_lag",
    "throughput_drop",
)


# ---------------------------------------------------------------------------------------
# Input: the per-interval rows of both windows


@dataclass(frozen=True)
class OpPoint:
    """One ``intervals`` row: a (pid, source, op) over one tracer interval."""

    ts_start: float
    ts_end: float
    pid: int
    source: str
    op: str
    count: int
    total_ns: int
    p95_ns: float
    errors: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class HostPoint:
    ts_start: float
    ts_end: float
    offcpu_ns: int = 0
    page_allocs: int = 0
    block_io_count: int = 0
    block_io_p99_ns: int | None = None
    tcp_retransmits: int = 0


@dataclass(frozen=True)
class GpuPoint:
    """One ``gpu_intervals`` row; throttle/XID only where the node DB records them."""

    ts_start: float
    ts_end: float
    gpu: int
    busy_ns: int | None = None
    throttled: bool = False
    throttle_detail: str | None = None  # e.g. "throttle_reasons=0x40 (hw_thermal_slowdown)"
    xid: int | None = None


@dataclass(frozen=True)
class CollectiveCall:
    """One sampled NCCL collective (``raw_events`` or ``nccl_calls``); ``ts`` is when it
    returned (its arrival where it had not returned when written: then ``duration_ns`` is 0
    and ``returned`` False). ``seq``: its number on its communicator in its process, where
    the tracer numbered it (node DB v3), else None."""

    ts: float
    duration_ns: int
    pid: int
    op: str
    comm_hash: str
    rank: int | None = None
    node: str | None = None
    seq: int | None = None
    returned: bool = True

    @property
    def arrival(self) -> float:
        return self.ts - self.duration_ns / 1e9


# Which collective a call is part of: (communicator hash, op, number). The number is the
# call's ``seq`` where every call of its communicator has one, else its position among its
# rank's calls of that communicator and op.
CollectiveId = tuple[str, str, int]
RankKey = tuple[str | None, int]  # (node, pid)


def join_collectives(
    calls: Iterable[CollectiveCall],
) -> dict[CollectiveId, dict[RankKey, CollectiveCall]]:
    """The ranks' calls of each collective, joined across ranks (and nodes).

    Where the tracer numbered a communicator's collectives (node DB v3: ``nccl_calls`` and
    ``raw_events.detail.seq``), one collective is its (communicator, seq) on every rank, so
    a rank whose sample misses a call leaves the others' collectives where they are. A
    communicator with any call without a number (an older node DB among the ranks) falls
    back to "the i-th call of each rank (per op) is one collective", which one missing
    sample shifts. A call seen twice (the same rank and key) is kept once, the first.
    """
    by_comm: dict[str, list[CollectiveCall]] = defaultdict(list)
    for c in calls:
        by_comm[c.comm_hash].append(c)
    out: dict[CollectiveId, dict[RankKey, CollectiveCall]] = defaultdict(dict)
    for comm, members in by_comm.items():
        if all(c.seq is not None for c in members):
            for c in members:
                assert c.seq is not None
                out[(comm, c.op, c.seq)].setdefault((c.node, c.pid), c)
            continue
        position: dict[tuple[str, RankKey], int] = defaultdict(int)
        for c in sorted(members, key=lambda c: c.ts):
            i = position[(c.op, (c.node, c.pid))]
            position[(c.op, (c.node, c.pid))] = i + 1
            out[(comm, c.op, i)][(c.node, c.pid)] = c
    return dict(out)


@dataclass(frozen=True)
class Process:
    pid: int
    comm: str | None = None
    job_id: str | None = None
    rank: int | None = None


@dataclass(frozen=True)
class Timeline:
    """Rows with ``ts_end`` in ``(start, end]``; the recent window is ``(split, end]``."""

    start: float
    split: float
    end: float
    ops: tuple[OpPoint, ...] = ()
    host: tuple[HostPoint, ...] = ()
    gpus: tuple[GpuPoint, ...] = ()
    collectives: tuple[CollectiveCall, ...] = ()
    processes: Mapping[int, Process] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------
# Output


@dataclass(frozen=True)
class Signal:
    id: str
    layer: str
    text: str
    strength: float  # size of the change, log2 scale; orders signals of one kind
    evidence: dict[str, Any]
    pids: frozenset[int] | None  # None: node-wide
    onset: float | None  # ts_end of the first recent interval past the baseline
    series: dict[float, float]  # ts_end -> value, over both windows
    rising: bool = True  # the value goes up when things get worse (False: a drop)


@dataclass(frozen=True)
class Link:
    """``cause`` leads to ``effect``: how well they line up, and why."""

    cause: str
    effect: str
    confidence: float
    time: str
    process: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "effect": self.effect,
            "confidence": round(self.confidence, 2),
            "time": self.time,
            "process": self.process,
        }


def _step(s: Signal) -> dict[str, Any]:
    return {
        "signal": s.id,
        "layer": s.layer,
        "text": s.text,
        "onset": s.onset,
        "pids": None if s.pids is None else sorted(s.pids),
        "evidence": s.evidence,
    }


@dataclass(frozen=True)
class Chain:
    """Causes (together) -> the CUDA/NCCL change that carries them -> the throughput drop."""

    rule: str
    name: str
    confidence: float
    causes: tuple[Signal, ...]
    via: Signal | None
    effect: Signal | None
    links: tuple[Link, ...]
    fix: str
    missing: tuple[str, ...] = ()  # layers the rule expects that were not found

    @property
    def level(self) -> str:
        return confidence_level(self.confidence)

    def headline(self) -> str:
        """Effect first, as a person reads it: ``launch rate down ← … ← cause``."""
        parts = [s.text for s in (self.effect, self.via) if s is not None]
        parts.append(" + ".join(s.text for s in self.causes))
        return " ← ".join(parts) + f" ← {self.name}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "name": self.name,
            "confidence": round(self.confidence, 2),
            "level": self.level,
            "headline": self.headline(),
            "causes": [_step(s) for s in self.causes],
            "via": None if self.via is None else _step(self.via),
            "effect": None if self.effect is None else _step(self.effect),
            "links": [link.as_dict() for link in self.links],
            "missing": list(self.missing),
            "fix": self.fix,
        }


def confidence_level(value: float) -> str:
    return "high" if value >= 0.6 else "medium" if value >= 0.35 else "low"


# ---------------------------------------------------------------------------------------
# The rule table


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    prior: float
    fix: str
    cause_any: tuple[str, ...] = ()
    cause_all: tuple[str, ...] = ()
    via_any: tuple[str, ...] = ()
    unless_any: tuple[str, ...] = ()
    effect_any: tuple[str, ...] = ()


_RULE_KEYS: Final = {
    "id",
    "name",
    "prior",
    "fix",
    "cause_any",
    "cause_all",
    "via_any",
    "unless_any",
    "effect_any",
}


def parse_rules(data: Any, origin: str = "rules") -> tuple[Rule, ...]:
    """The rule table from its YAML value; ConfigError naming the rule and key when bad."""
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        raise ConfigError(f"{origin}: expected a mapping with a 'rules' list")
    rules = []
    seen: set[str] = set()
    for i, item in enumerate(data["rules"]):
        where = f"{origin}: rules[{i}]"
        if not isinstance(item, dict):
            raise ConfigError(f"{where}: expected a mapping")
        unknown = set(item) - _RULE_KEYS
        if unknown:
            raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r}")
        for key in ("id", "name", "fix"):
            if not isinstance(item.get(key), str) or not item[key].strip():
                raise ConfigError(f"{where}: {key!r} must be a non-empty string")
        where = f"{origin}: rule {item['id']!r}"
        if item["id"] in seen:
            raise ConfigError(f"{where}: duplicate id")
        seen.add(item["id"])
        prior = item.get("prior")
        if not isinstance(prior, int | float) or isinstance(prior, bool) or not 0 < prior <= 1:
            raise ConfigError(f"{where}: 'prior' must be a number in (0, 1]")
        lists: dict[str, tuple[str, ...]] = {}
        for key in ("cause_any", "cause_all", "via_any", "unless_any", "effect_any"):
            value = item.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{where}: {key!r} must be a list of signal names")
            bad = [v for v in value if v not in SIGNALS]
            if bad:
                raise ConfigError(f"{where}: {key!r}: unknown signal {bad[0]!r}")
            lists[key] = tuple(value)
        if not lists["cause_any"] and not lists["cause_all"]:
            raise ConfigError(f"{where}: needs cause_any or cause_all")
        rules.append(
            Rule(
                id=item["id"],
                name=item["name"],
                prior=float(prior),
                fix=" ".join(item["fix"].split()),
                **lists,
            )
        )
    return tuple(rules)


def load_rules() -> tuple[Rule, ...]:
    """The rule table shipped in the package (``ingero/explain/rules.yaml``)."""
    text = resources.files("ingero.explain").joinpath("rules.yaml").read_text()
    return parse_rules(yaml.safe_load(text), "ingero/explain/rules.yaml")


# ---------------------------------------------------------------------------------------
# Signals


def _recent(ts: float, t: Timeline) -> bool:
    return ts > t.split


def _median(values: Iterable[float]) -> float | None:
    data = list(values)
    return statistics.median(data) if data else None


def _onset(
    series: Mapping[float, float], split: float, threshold: float, rising: bool
) -> float | None:
    """The first recent interval whose value is past ``threshold`` (the baseline's bound)."""
    for ts in sorted(series):
        if ts > split and (series[ts] >= threshold if rising else series[ts] <= threshold):
            return ts
    return None


def _span(points: Iterable[tuple[float, float]]) -> float:
    """Seconds the rows cover (latest end - earliest start), as the analysis measures."""
    pts = list(points)
    return max(0.0, max(e for _, e in pts) - min(s for s, _ in pts)) if pts else 0.0


def _windows(t: Timeline, rows: Sequence[OpPoint]) -> tuple[list[OpPoint], list[OpPoint]]:
    return [r for r in rows if _recent(r.ts_end, t)], [r for r in rows if not _recent(r.ts_end, t)]


def _weighted_p95(rows: Sequence[OpPoint]) -> float:
    n = sum(r.count for r in rows)
    return sum(r.p95_ns * r.count for r in rows) / n if n else 0.0


def _comm(t: Timeline, pid: int) -> str:
    p = t.processes.get(pid)
    return f"pid {pid} ({p.comm})" if p is not None and p.comm else f"pid {pid}"


def _pids_text(t: Timeline, pids: Iterable[int]) -> str:
    ordered = sorted(pids)
    text = ", ".join(_comm(t, p) for p in ordered[:3])
    return text + (f" and {len(ordered) - 3} more" if len(ordered) > 3 else "")


def _proc_evidence(t: Timeline, pids: Iterable[int]) -> list[dict[str, Any]]:
    out = []
    for pid in sorted(pids):
        p = t.processes.get(pid)
        out.append(
            {
                "pid": pid,
                "comm": p.comm if p else None,
                "job_id": p.job_id if p else None,
                "rank": p.rank if p else None,
            }
        )
    return out


def _series(rows: Iterable[OpPoint], value: Any) -> dict[float, float]:
    by_tick: dict[float, list[OpPoint]] = defaultdict(list)
    for r in rows:
        by_tick[r.ts_end].append(r)
    return {ts: float(value(group)) for ts, group in sorted(by_tick.items())}


def _offcpu_signal(t: Timeline) -> Signal | None:
    rows = [r for r in t.ops if r.source == "host" and r.op == OFFCPU_OP]
    recent, base = _windows(t, rows)
    if not recent or not base:
        return _host_offcpu_signal(t)
    span_r = _span((r.ts_start, r.ts_end) for r in recent)
    span_b = _span((r.ts_start, r.ts_end) for r in base)
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
    series = _series([r for r in rows if r.pid in pids], lambda g: sum(r.total_ns for r in g))
    base_vals = [v for ts, v in series.items() if ts <= t.split]
    onset = _onset(series, t.split, (_median(base_vals) or 0.0) * OFFCPU_GROWTH, True)
    ratio = frac_now / frac_before if frac_before > 0 else rate_now / max(rate_before, 1e-9)
    return Signal(
        id="offcpu",
        layer="host",
        text=(
            f"{switches:,} off-CPU switches of the threads of {_pids_text(t, pids)}"
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
            "processes": _proc_evidence(t, pids),
            "source": "intervals (source host, op offcpu: sched_switch)",
        },
        pids=frozenset(pids),
        onset=onset,
        series=series,
    )


def _host_offcpu_signal(t: Timeline) -> Signal | None:
    """Node-wide off-CPU time (host_intervals) when no per-process rows exist."""
    recent = [h for h in t.host if _recent(h.ts_end, t)]
    base = [h for h in t.host if not _recent(h.ts_end, t)]
    span_r = _span((h.ts_start, h.ts_end) for h in recent)
    span_b = _span((h.ts_start, h.ts_end) for h in base)
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
        onset=_onset(series, t.split, (_median(base_vals) or 0.0) * OFFCPU_GROWTH, True),
        series=series,
    )


def _host_signals(t: Timeline) -> list[Signal]:
    recent = [h for h in t.host if _recent(h.ts_end, t)]
    base = [h for h in t.host if not _recent(h.ts_end, t)]
    span_r = _span((h.ts_start, h.ts_end) for h in recent)
    span_b = _span((h.ts_start, h.ts_end) for h in base)
    if span_r <= 0:
        return []
    out = []

    def rate(rows: list[HostPoint], attr: str, span: float) -> float:
        return sum(getattr(h, attr) for h in rows) / span if span > 0 else 0.0

    allocs_now, allocs_before = (
        rate(recent, "page_allocs", span_r),
        rate(base, "page_allocs", span_b),
    )
    if allocs_before > 0 and allocs_now / allocs_before >= HOST_GROWTH:
        series = {h.ts_end: float(h.page_allocs) for h in t.host}
        out.append(
            Signal(
                id="page_allocs",
                layer="host",
                text=f"page allocations {allocs_now / allocs_before:.1f}{TIMES}"
                f" ({fmt_rate(allocs_now)}, was {fmt_rate(allocs_before)})",
                strength=math.log2(allocs_now / allocs_before),
                evidence={
                    "pages": sum(h.page_allocs for h in recent),
                    "rate": round(allocs_now, 1),
                    "rate_baseline": round(allocs_before, 1),
                    "source": "host_intervals.page_allocs (kmem:mm_page_alloc)",
                },
                pids=None,
                onset=_onset(
                    series,
                    t.split,
                    (_median(h.page_allocs for h in base) or 0.0) * HOST_GROWTH,
                    True,
                ),
                series=series,
            )
        )
    p99_now = max((h.block_io_p99_ns or 0 for h in recent), default=0)
    p99_before = max((h.block_io_p99_ns or 0 for h in base), default=0)
    io_now, io_before = rate(recent, "block_io_count", span_r), rate(base, "block_io_count", span_b)
    slower = p99_before > 0 and p99_now / p99_before >= HOST_GROWTH
    more = io_before > 0 and io_now / io_before >= HOST_GROWTH and p99_now >= p99_before
    if slower or (more and p99_now > 0):
        series = {h.ts_end: float(h.block_io_p99_ns or 0) for h in t.host}
        ratio = p99_now / p99_before if slower else io_now / io_before
        out.append(
            Signal(
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
                onset=_onset(
                    series, t.split, max(p99_before, 1) * (HOST_GROWTH if slower else 1), True
                ),
                series=series,
            )
        )
    retx_now = sum(h.tcp_retransmits for h in recent)
    retx_before = sum(h.tcp_retransmits for h in base)
    retx_rate_before = retx_before / span_b if span_b > 0 else 0.0
    if retx_now and retx_now / span_r >= HOST_GROWTH * retx_rate_before:
        series = {h.ts_end: float(h.tcp_retransmits) for h in t.host}
        out.append(
            Signal(
                id="tcp_retransmits",
                layer="host",
                text=f"{retx_now:,} TCP retransmits (was {retx_before:,})",
                strength=math.log2(1 + retx_now / max(retx_before, 1)),
                evidence={
                    "retransmits": retx_now,
                    "retransmits_baseline": retx_before,
                    "source": "host_intervals.tcp_retransmits (tcp:tcp_retransmit_skb)",
                },
                pids=None,
                onset=_onset(
                    series,
                    t.split,
                    max(1.0, HOST_GROWTH * (_median(h.tcp_retransmits for h in base) or 0.0)),
                    True,
                ),
                series=series,
            )
        )
    return out


def _gpu_signals(t: Timeline) -> list[Signal]:
    out = []
    recent = [g for g in t.gpus if _recent(g.ts_end, t)]
    base = [g for g in t.gpus if not _recent(g.ts_end, t)]
    throttled = [g for g in recent if g.throttled]
    if throttled:
        before = sum(1 for g in base if g.throttled)
        share_now = len(throttled) / len(recent)
        share_before = before / len(base) if base else 0.0
        if share_now - share_before >= SHARE_GROWTH:
            gpus = sorted({g.gpu for g in throttled})
            reasons = sorted({g.throttle_detail for g in throttled if g.throttle_detail})
            series = {
                ts: float(sum(1 for g in t.gpus if g.ts_end == ts and g.throttled))
                for ts in sorted({g.ts_end for g in t.gpus})
            }
            out.append(
                Signal(
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
            )
    xids = [g for g in recent if g.xid]
    if xids and not any(g.xid for g in base):
        series = {
            ts: float(sum(1 for g in t.gpus if g.ts_end == ts and g.xid))
            for ts in sorted({g.ts_end for g in t.gpus})
        }
        out.append(
            Signal(
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
        )
    return out


def _latency_kind(source: str, op: str) -> str | None:
    if source == "nccl":
        return "nccl_latency"
    if op in LAUNCH_OPS:
        return "launch_latency"
    if op in SYNC_OPS:
        return "sync_latency"
    if op in ALLOC_OPS or "memcpy" in op.lower() or source not in ("cuda_runtime", "cuda_driver"):
        return None  # memcpy and the allocator have signals of their own; host rows are not calls
    return "op_latency"


def _op_signals(t: Timeline) -> list[Signal]:
    """Per (source, op): p95 up (latency kinds), memcpy time share, allocator churn."""
    by_op: dict[tuple[str, str], list[OpPoint]] = defaultdict(list)
    for r in t.ops:
        if r.op not in STEP_OPS and r.op != OFFCPU_OP:
            by_op[(r.source, r.op)].append(r)
    recent_all, base_all = _windows(t, [r for r in t.ops if r.op != OFFCPU_OP])
    span_r = _span((r.ts_start, r.ts_end) for r in recent_all)
    span_b = _span((r.ts_start, r.ts_end) for r in base_all)
    n_pids = max(1, len({r.pid for r in recent_all}))
    out: list[Signal] = []
    best: dict[str, Signal] = {}
    memcpy_now: list[OpPoint] = []
    memcpy_before: list[OpPoint] = []
    alloc: list[Signal] = []
    for (source, op), rows in sorted(by_op.items()):
        recent, base = _windows(t, rows)
        if "memcpy" in op.lower():
            memcpy_now += recent
            memcpy_before += base
        if op in ALLOC_OPS and span_r > 0 and span_b > 0:
            rate_now, rate_before = (
                sum(r.count for r in recent) / span_r,
                sum(r.count for r in base) / span_b,
            )
            calls = sum(r.count for r in recent)
            if calls >= MIN_CALLS and rate_now >= ALLOC_GROWTH * rate_before:
                pids = frozenset(r.pid for r in recent)
                series = _series(rows, lambda g: sum(r.count for r in g))
                base_med = _median(v for ts, v in series.items() if ts <= t.split) or 0.0
                ratio = rate_now / rate_before if rate_before > 0 else float(calls)
                alloc.append(
                    Signal(
                        id="alloc_churn",
                        layer="cuda",
                        text=f"{calls:,} {op} calls ({fmt_rate(rate_now)}, was"
                        f" {fmt_rate(rate_before)}) in {_pids_text(t, pids)},"
                        f" {fmt_ns(sum(r.total_ns for r in recent))} in total",
                        strength=math.log2(max(ratio, 2.0)),
                        evidence={
                            "op": op,
                            "source": source,
                            "calls": calls,
                            "rate": round(rate_now, 2),
                            "rate_baseline": round(rate_before, 2),
                            "total_ns": sum(r.total_ns for r in recent),
                            "processes": _proc_evidence(t, pids),
                        },
                        pids=pids,
                        onset=_onset(series, t.split, max(1.0, base_med * ALLOC_GROWTH), True),
                        series=series,
                    )
                )
        kind = _latency_kind(source, op)
        if kind is None:
            continue
        n_now, n_before = sum(r.count for r in recent), sum(r.count for r in base)
        p_now, p_before = _weighted_p95(recent), _weighted_p95(base)
        if min(n_now, n_before) < MIN_CALLS or p_before <= 0 or p_now / p_before < LATENCY_RATIO:
            continue
        pids = frozenset(
            pid
            for pid in {r.pid for r in recent}
            if (b := _weighted_p95([r for r in base if r.pid == pid])) > 0
            and _weighted_p95([r for r in recent if r.pid == pid]) / b >= LATENCY_RATIO
        ) or frozenset(r.pid for r in recent)
        series = _series(rows, _weighted_p95)
        base_med = _median(v for ts, v in series.items() if ts <= t.split) or p_before
        label = f"NCCL {op}" if source == "nccl" else op
        sig = Signal(
            id=kind,
            layer="nccl" if source == "nccl" else "cuda",
            text=f"{label} p95 {p_now / p_before:.1f}{TIMES} ({fmt_ns(p_now)}, was"
            f" {fmt_ns(p_before)}) in {_pids_text(t, pids)}",
            strength=math.log2(p_now / p_before),
            evidence={
                "op": op,
                "source": source,
                "calls": n_now,
                "p95_ns": round(p_now),
                "p95_ns_baseline": round(p_before),
                "ratio": round(p_now / p_before, 2),
                "processes": _proc_evidence(t, pids),
            },
            pids=pids,
            onset=_onset(series, t.split, base_med * LATENCY_RATIO, True),
            series=series,
        )
        if kind not in best or sig.strength > best[kind].strength:
            best[kind] = sig
    out += best.values()
    if alloc:
        out.append(max(alloc, key=lambda s: s.strength))
    if memcpy_now and span_r > 0 and span_b > 0:
        share_now = sum(r.total_ns for r in memcpy_now) / (span_r * 1e9 * n_pids)
        n_before_pids = max(1, len({r.pid for r in base_all}))
        share_before = sum(r.total_ns for r in memcpy_before) / (span_b * 1e9 * n_before_pids)
        if share_now - share_before >= SHARE_GROWTH:
            pids = frozenset(r.pid for r in memcpy_now)
            series = _series(
                [r for r in t.ops if "memcpy" in r.op.lower()], lambda g: sum(r.total_ns for r in g)
            )
            base_med = _median(v for ts, v in series.items() if ts <= t.split) or 0.0
            ops = sorted({r.op for r in memcpy_now})
            out.append(
                Signal(
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
                        "processes": _proc_evidence(t, pids),
                    },
                    pids=pids,
                    onset=_onset(series, t.split, base_med * (1 + 2 * SHARE_GROWTH) + 1, True),
                    series=series,
                )
            )
    return out


def _throughput_signal(t: Timeline) -> Signal | None:
    """Kernel-launch rate, else step rate, else GPU busy: down by RATE_DROP or more."""
    for names, label in ((LAUNCH_OPS, "kernel-launch rate"), (STEP_OPS, "step rate")):
        rows = [r for r in t.ops if r.op in names]
        recent, base = _windows(t, rows)
        span_r = _span((r.ts_start, r.ts_end) for r in recent)
        span_b = _span((r.ts_start, r.ts_end) for r in base)
        if span_r <= 0 or span_b <= 0:
            continue
        now = sum(r.count for r in recent) / span_r
        before = sum(r.count for r in base) / span_b
        if before <= 0 or now / before > 1.0 - RATE_DROP:
            # The rate did not drop, or this row kind is absent; a step source wins only
            # when launches are not traced.
            if before > 0:
                return None
            continue
        pids = set()
        for pid in {r.pid for r in base}:
            b = sum(r.count for r in base if r.pid == pid) / span_b
            n = sum(r.count for r in recent if r.pid == pid) / span_r
            if b > 0 and n / b <= 1.0 - RATE_DROP:
                pids.add(pid)
        series = _series(
            rows,
            lambda g: (
                sum(r.count for r in g)
                / max(1e-9, max(r.ts_end for r in g) - min(r.ts_start for r in g))
            ),
        )
        base_med = _median(v for ts, v in series.items() if ts <= t.split) or before
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
                "processes": _proc_evidence(t, pids),
            },
            pids=frozenset(pids) or None,
            onset=_onset(series, t.split, base_med * (1.0 - RATE_DROP), False),
            series=series,
            rising=False,
        )
    g_recent = [g for g in t.gpus if _recent(g.ts_end, t) and g.busy_ns is not None]
    g_base = [g for g in t.gpus if not _recent(g.ts_end, t) and g.busy_ns is not None]

    def busy(rows: list[GpuPoint]) -> float:
        span = sum(g.ts_end - g.ts_start for g in rows)
        return sum(g.busy_ns or 0 for g in rows) / 1e9 / span if span > 0 else 0.0

    if g_recent and g_base and busy(g_base) - busy(g_recent) >= GPU_BUSY_DROP:
        now, before = busy(g_recent), busy(g_base)
        series = {
            ts: busy([g for g in t.gpus if g.ts_end == ts and g.busy_ns is not None])
            for ts in sorted({g.ts_end for g in t.gpus})
        }
        base_med = _median(v for ts, v in series.items() if ts <= t.split) or before
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
            onset=_onset(series, t.split, base_med - GPU_BUSY_DROP, False),
            series=series,
            rising=False,
        )
    return None


def peer_lag_signal(t: Timeline) -> Signal | None:
    """The rank that reaches a communicator's collectives last, most of the time.

    Collectives are joined across ranks by ``join_collectives`` (their sequence number
    where the tracer numbered them). A round is a collective every rank seen (per
    communicator and op) has a sampled call in. A rank's arrival is when its call began;
    the others wait for the last one to arrive.
    """
    calls = [c for c in t.collectives if _recent(c.ts, t)]
    groups: dict[tuple[str, str], dict[int, dict[RankKey, CollectiveCall]]] = defaultdict(dict)
    for (comm, op, n), members in join_collectives(calls).items():
        groups[(comm, op)][n] = members
    worst: tuple[float, Signal] | None = None
    for (comm, op), collectives in groups.items():
        everyone = {k for members in collectives.values() for k in members}
        if len(everyone) < 2:
            continue
        full = [m for _, m in sorted(collectives.items()) if len(m) == len(everyone)]
        rounds = len(full)
        if rounds < PEER_MIN_ROUNDS:
            continue
        ranks: dict[RankKey, list[CollectiveCall]] = defaultdict(list)
        last: dict[RankKey, int] = defaultdict(int)
        lags: dict[RankKey, list[float]] = defaultdict(list)
        for members in full:
            for k, c in members.items():
                ranks[k].append(c)
            arrivals = {k: c.arrival for k, c in members.items()}
            latest = max(arrivals, key=lambda k: arrivals[k])
            last[latest] += 1
            others = [a for k, a in arrivals.items() if k != latest]
            lags[latest].append((arrivals[latest] - statistics.median(others)) * 1e9)
        key, times = max(last.items(), key=lambda kv: kv[1])
        share = times / rounds
        lag_ns = statistics.median(lags[key])
        if share < PEER_LAST_SHARE or lag_ns < PEER_MIN_LAG_NS:
            continue
        node, pid = key
        rank = next((c.rank for c in ranks[key] if c.rank is not None), None)
        who = (f"rank {rank}" if rank is not None else _comm(t, pid)) + (
            f" on {node}" if node else ""
        )
        sig = Signal(
            id="peer_lag",
            layer="nccl",
            text=f"{who} reaches {op} last in {times} of {rounds} collectives of communicator"
            f" {comm[:8]}, {fmt_ns(lag_ns)} after the others (median)",
            strength=math.log2(1 + lag_ns / 1e6) * share,
            evidence={
                "communicator": comm,
                "op": op,
                "late_rank": rank,
                "late_pid": pid,
                "late_node": node,
                "rounds": rounds,
                "last_in": times,
                "median_lag_ns": round(lag_ns),
                "ranks": len(ranks),
                # "seq": joined by the tracer's sequence numbers; "position": the i-th
                # call of each rank (a node DB older than v3 among the ranks)
                "joined_by": "seq"
                if all(c.seq is not None for m in full for c in m.values())
                else "position",
            },
            pids=frozenset(p for _, p in ranks),
            onset=min(c.ts for c in ranks[key]),
            series={},
        )
        if worst is None or sig.strength > worst[0]:
            worst = (sig.strength, sig)
    return worst[1] if worst else None


def signals(t: Timeline) -> dict[str, Signal]:
    """Every signal present in the timeline, by id (the strongest of a kind)."""
    found: list[Signal] = []
    for sig in (_offcpu_signal(t), _throughput_signal(t), peer_lag_signal(t)):
        if sig is not None:
            found.append(sig)
    found += _host_signals(t) + _gpu_signals(t) + _op_signals(t)
    out: dict[str, Signal] = {}
    for sig in found:
        if sig.id not in out or sig.strength > out[sig.id].strength:
            out[sig.id] = sig
    return out


# ---------------------------------------------------------------------------------------
# Links and chains


def _correlation(a: Mapping[float, float], b: Mapping[float, float]) -> float | None:
    common = sorted(set(a) & set(b))
    if len(common) < 4:
        return None
    xs, ys = [a[k] for k in common], [b[k] for k in common]
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:  # a constant series
        return None


def link(cause: Signal, effect: Signal, tick_s: float) -> Link:
    """How well ``cause`` lines up with ``effect`` in time and by process (0..1)."""
    # Time: the cause should start no later than one interval after the effect (a flush
    # boundary can split them), and the per-interval series should move together: the
    # same direction when both rise, opposite when the effect is a drop.
    score_t, notes = 0.7, []
    if cause.onset is not None and effect.onset is not None:
        lag = effect.onset - cause.onset
        aligned = lag >= -tick_s * 1.01
        score_t = 0.9 if aligned else 0.4
        notes.append(
            f"{cause.id} began {abs(lag):.0f} s {'before' if lag >= 0 else 'after'} {effect.id}"
            if lag
            else f"{cause.id} and {effect.id} began in the same interval"
        )
    r = _correlation(cause.series, effect.series)
    if r is not None:
        same_way = r if cause.rising == effect.rising else -r
        score_t = min(1.0, max(0.2, score_t + 0.3 * same_way))
        notes.append(f"per-interval correlation {same_way:+.2f}")
    if not notes:
        notes.append("no per-interval timing to compare")
    # Process: the same PIDs on both ends; a node-wide end cannot be tied to a process.
    if cause.pids is not None and effect.pids is not None:
        shared = cause.pids & effect.pids
        score_p = 1.0 if shared else 0.5
        process = (
            f"same process: pid {', '.join(map(str, sorted(shared)[:5]))}"
            if shared
            else "different processes"
        )
    else:
        score_p = 0.85
        process = "node-wide: not tied to one process"
    return Link(cause.id, effect.id, score_t * score_p, "; ".join(notes), process)


def _tick_s(t: Timeline) -> float:
    ticks = sorted({r.ts_end for r in t.ops} | {h.ts_end for h in t.host})
    gaps = [b - a for a, b in itertools.pairwise(ticks) if b > a]
    return statistics.median(gaps) if gaps else 0.0


def build_chains(t: Timeline, rules: Sequence[Rule], found: Mapping[str, Signal]) -> list[Chain]:
    """One chain per rule whose cause is present and not explained better by another rule."""
    tick = _tick_s(t)
    chains = []
    for rule in rules:
        if rule.cause_all and not all(s in found for s in rule.cause_all):
            continue
        if rule.cause_any and not any(s in found for s in rule.cause_any):
            continue
        if any(s in found for s in rule.unless_any):
            continue
        causes = [found[s] for s in (*rule.cause_all, *rule.cause_any) if s in found]
        if any(c.id not in rule.via_any for c in causes):
            # A signal the rule also lists as `via` carries a stronger cause found beside it.
            causes = [c for c in causes if c.id not in rule.via_any]
        used = {s.id for s in causes}
        candidates = [found[s] for s in rule.via_any if s in found and s not in used]
        via = max(candidates, key=lambda s: s.strength) if candidates else None
        effect = next((found[s] for s in rule.effect_any if s in found and s not in used), None)
        # Every cause leads to the next layer found (the via change, else the effect).
        nxt = via or effect
        links = [link(c, nxt, tick) for c in causes] if nxt is not None else []
        if via is not None and effect is not None:
            links.append(link(via, effect, tick))
        missing = []
        confidence = rule.prior * (min(lk.confidence for lk in links) if links else 0.5)
        if rule.via_any and via is None:
            missing.append("via")
            confidence *= 0.8
        if rule.effect_any and effect is None:
            missing.append("effect")
            confidence *= 0.6
        chains.append(
            Chain(
                rule.id,
                rule.name,
                confidence,
                tuple(causes),
                via,
                effect,
                tuple(links),
                rule.fix,
                tuple(missing),
            )
        )
    chains.sort(key=lambda c: (-c.confidence, c.rule))
    return chains


def explain_chains(t: Timeline, rules: Sequence[Rule] | None = None) -> list[Chain]:
    """Ranked causal chains for the timeline (the package's rule table by default)."""
    return build_chains(t, load_rules() if rules is None else rules, signals(t))
