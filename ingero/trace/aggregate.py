"""Per-interval aggregates from the kernel's cumulative counters and histograms.

The BPF program keeps, per (pid, op), cumulative count/total/errors/bytes and a
log-linear duration histogram: values below 4 ns are exact, above that each power of two
[2^l, 2^(l+1)) is split into 4 equal sub-buckets (slot = 4·l + sub). Each interval is the
difference of two snapshots. Percentiles use the nearest-rank method on the interval's
histogram, interpolated linearly inside the chosen bucket, so the error is bounded by
the bucket width (at most 25% of the value, typically under 12.5%). Durations of 2^40 ns
(about 18 minutes) and more share the last bucket.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from ingero.trace.ops import OPS, op_name

Key = tuple[int, int]  # (pid, op id)
StreamKey = tuple[int, int]  # (pid, stream handle)
Histogram = Mapping[int, int]  # slot → count


@dataclass(frozen=True)
class StatVal:
    count: int = 0
    total_ns: int = 0
    errors: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class StreamVal:
    """A (process, stream)'s cumulative syncs, launches and steps (sync-to-sync gaps)."""

    syncs: int = 0
    sync_ns: int = 0
    launches: int = 0
    steps: int = 0
    step_ns: int = 0
    hist: Histogram = field(default_factory=dict)  # step durations


@dataclass(frozen=True)
class Snapshot:
    """Cumulative kernel state at one moment."""

    stats: Mapping[Key, StatVal]
    hist: Mapping[Key, Histogram]
    host: Mapping[str, int]
    streams: Mapping[StreamKey, StreamVal] = field(default_factory=dict)


NSLOTS = 160  # as in bpf/ingero.bpf.c: the last slot also holds everything from 2^40 ns


def slot_of(value: int) -> int:
    """The bucket of a duration, exactly as ``slot_of`` in bpf/ingero.bpf.c computes it."""
    if value < 4:
        return max(value, 0)
    log = value.bit_length() - 1
    return min(log * 4 + ((value >> (log - 2)) & 3), NSLOTS - 1)


def slot_bounds(slot: int) -> tuple[int, int]:
    """[lo, hi) of the values in a bucket."""
    if slot < 4:
        return slot, slot + 1
    log, sub = divmod(slot, 4)
    width = 1 << (log - 2)
    lo = (4 + sub) * width
    return lo, lo + width


def percentile(hist: Histogram, q: float) -> int:
    """Nearest-rank percentile ``q`` (0 < q ≤ 1) of a histogram, interpolated in its bucket."""
    total = sum(c for c in hist.values() if c > 0)
    if total == 0:
        return 0
    rank = max(1, math.ceil(q * total))
    seen = 0
    for slot in sorted(hist):
        count = hist[slot]
        if count <= 0:
            continue
        if seen + count >= rank:
            lo, hi = slot_bounds(slot)
            return int(lo + (hi - lo) * (rank - seen) / (count + 1))
        seen += count
    lo, hi = slot_bounds(max(hist))
    return hi - 1


def _minus(cur: int, prev: int) -> int:
    # A kernel entry deleted and re-created restarts from zero: the new value is the delta.
    return cur - prev if cur >= prev else cur


def diff_stats(prev: Mapping[Key, StatVal], cur: Mapping[Key, StatVal]) -> dict[Key, StatVal]:
    out = {}
    for key, c in cur.items():
        p = prev.get(key, StatVal())
        if c.count < p.count:
            p = StatVal()
        d = StatVal(
            _minus(c.count, p.count),
            _minus(c.total_ns, p.total_ns),
            _minus(c.errors, p.errors),
            _minus(c.bytes, p.bytes),
        )
        if d.count:
            out[key] = d
    return out


def diff_hist(prev: Histogram, cur: Histogram) -> dict[int, int]:
    out = {}
    for slot, c in cur.items():
        d = _minus(c, prev.get(slot, 0))
        if d:
            out[slot] = d
    return out


@dataclass(frozen=True)
class Tags:
    job_id: str | None = None
    rank: int | None = None


def interval_rows(
    prev: Snapshot,
    cur: Snapshot,
    ts_start: float,
    ts_end: float,
    tags: Mapping[int, Tags],
) -> list[dict[str, object]]:
    """Rows for the ``intervals`` table: one per (pid, op) that had calls in the interval."""
    rows: list[dict[str, object]] = []
    for (pid, op_id), d in sorted(diff_stats(prev.stats, cur.stats).items()):
        h = diff_hist(prev.hist.get((pid, op_id), {}), cur.hist.get((pid, op_id), {}))
        tag = tags.get(pid, Tags())
        rows.append(
            {
                "ts_start": ts_start,
                "ts_end": ts_end,
                "pid": pid,
                "job_id": tag.job_id,
                "rank": tag.rank,
                "source": OPS[op_id].source if 0 <= op_id < len(OPS) else "unknown",
                "op": op_name(op_id),
                "count": d.count,
                "total_ns": d.total_ns,
                "p50_ns": percentile(h, 0.50),
                "p95_ns": percentile(h, 0.95),
                "p99_ns": percentile(h, 0.99),
                "errors": d.errors,
                "bytes": d.bytes,
            }
        )
    return rows


def stream_label(handle: int) -> str:
    """A stream handle as the node DB keeps it: 16 lowercase hex digits (a u64 handle does
    not fit SQLite's signed integer; the text is the join key)."""
    return f"{handle & (2**64 - 1):016x}"


def stream_rows(
    prev: Snapshot,
    cur: Snapshot,
    ts_start: float,
    ts_end: float,
    tags: Mapping[int, Tags],
) -> list[dict[str, object]]:
    """Rows for ``stream_intervals``: one per (pid, stream) with syncs or launches in the
    interval; step percentiles from the interval's histogram, which the row keeps too
    (slot → count, JSON) for readers that split prefill from decode steps."""
    rows: list[dict[str, object]] = []
    for (pid, handle), c in sorted(cur.streams.items()):
        p = prev.streams.get((pid, handle), StreamVal())
        if c.syncs < p.syncs or c.launches < p.launches:
            p = StreamVal()  # the entry was deleted and re-created: it counts from zero
        syncs, launches = c.syncs - p.syncs, c.launches - p.launches
        if not syncs and not launches:
            continue
        h = diff_hist(p.hist, c.hist)
        tag = tags.get(pid, Tags())
        rows.append(
            {
                "ts_start": ts_start,
                "ts_end": ts_end,
                "pid": pid,
                "job_id": tag.job_id,
                "rank": tag.rank,
                "stream": stream_label(handle),
                "syncs": syncs,
                "sync_ns": _minus(c.sync_ns, p.sync_ns),
                "launches": launches,
                "steps": _minus(c.steps, p.steps),
                "step_ns": _minus(c.step_ns, p.step_ns),
                "step_p50_ns": percentile(h, 0.50),
                "step_p90_ns": percentile(h, 0.90),
                "step_hist": json.dumps({str(k): v for k, v in sorted(h.items())}),
            }
        )
    return rows


HOST_COUNTERS = (
    "page_allocs",
    "block_io_count",
    "block_io_ns",
    "tcp_retransmits",
    "dropped_events",
    "offcpu_ns",
    "samples",
)


def host_row(
    prev: Snapshot,
    cur: Snapshot,
    ts_start: float,
    ts_end: float,
    bio_hist: Histogram,
) -> dict[str, object]:
    """The ``host_intervals`` row: counter deltas plus block I/O p99 of the interval."""
    d = {k: _minus(cur.host.get(k, 0), prev.host.get(k, 0)) for k in HOST_COUNTERS}
    return {
        "ts_start": ts_start,
        "ts_end": ts_end,
        "offcpu_ns": d["offcpu_ns"],
        "page_allocs": d["page_allocs"],
        "block_io_count": d["block_io_count"],
        "block_io_p99_ns": percentile(bio_hist, 0.99),
        "tcp_retransmits": d["tcp_retransmits"],
        "dropped_events": d["dropped_events"],
    }
