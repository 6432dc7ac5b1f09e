"""A signal (one thing that changed between the two windows) and the measures detectors share."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ingero.explain.callsites import CallSite
from ingero.explain.chains.timeline import OpPoint, Timeline

OFFCPU_OP: Final = "offcpu"


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
    # Where the calls it is about came from (node DB v4 stacks), most CUDA time first.
    sites: tuple[CallSite, ...] = ()


# A detector looks for one signal in the timeline: the strongest of its kind, or None.
Detector = Callable[[Timeline], Signal | None]


def in_recent(ts: float, t: Timeline) -> bool:
    return ts > t.split


def median(values: Iterable[float]) -> float | None:
    data = list(values)
    return statistics.median(data) if data else None


def onset(
    series: Mapping[float, float], split: float, threshold: float, rising: bool
) -> float | None:
    """The first recent interval whose value is past ``threshold`` (the baseline's bound)."""
    for ts in sorted(series):
        if ts > split and (series[ts] >= threshold if rising else series[ts] <= threshold):
            return ts
    return None


def baseline_median(series: Mapping[float, float], split: float, default: float) -> float:
    """The median of a per-tick series over the baseline window (up to ``split``), or
    ``default`` where the baseline has no tick (or a median of 0)."""
    return median(v for ts, v in series.items() if ts <= split) or default


def count_growth(rate_now: float, rate_before: float, count: int) -> float:
    """A signal's strength for a call rate that grew: log2 of now/before (the count itself
    where there was none before), at least 1."""
    ratio = rate_now / rate_before if rate_before > 0 else float(count)
    return math.log2(max(ratio, 2.0))


def span(points: Iterable[tuple[float, float]]) -> float:
    """Seconds the rows cover (latest end - earliest start), as the analysis measures."""
    pts = list(points)
    return max(0.0, max(e for _, e in pts) - min(s for s, _ in pts)) if pts else 0.0


def windows(t: Timeline, rows: Sequence[OpPoint]) -> tuple[list[OpPoint], list[OpPoint]]:
    """(recent, baseline) rows."""
    return [r for r in rows if in_recent(r.ts_end, t)], [
        r for r in rows if not in_recent(r.ts_end, t)
    ]


def weighted_p95(rows: Sequence[OpPoint]) -> float:
    n = sum(r.count for r in rows)
    return sum(r.p95_ns * r.count for r in rows) / n if n else 0.0


def process_name(t: Timeline, pid: int) -> str:
    p = t.processes.get(pid)
    return f"pid {pid} ({p.comm})" if p is not None and p.comm else f"pid {pid}"


def pids_text(t: Timeline, pids: Iterable[int]) -> str:
    ordered = sorted(pids)
    text = ", ".join(process_name(t, p) for p in ordered[:3])
    return text + (f" and {len(ordered) - 3} more" if len(ordered) > 3 else "")


def proc_evidence(t: Timeline, pids: Iterable[int]) -> list[dict[str, Any]]:
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


def per_tick(rows: Iterable[OpPoint], value: Any) -> dict[float, float]:
    """``value`` of each interval's rows, by the interval's ``ts_end``."""
    by_tick: dict[float, list[OpPoint]] = defaultdict(list)
    for r in rows:
        by_tick[r.ts_end].append(r)
    return {ts: float(value(group)) for ts, group in sorted(by_tick.items())}
