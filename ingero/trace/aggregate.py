"""Per-interval aggregates from the kernel's cumulative counters and histograms.

The BPF program keeps, per (pid, op), cumulative count/total/errors/bytes and a
log-linear duration histogram: values below 4 ns are exact, above that each power of two
[2^l, 2^(l+1)) is split into 4 equal sub-buckets (slot = 4·l + sub). Each interval is the
difference of two snapshots. Percentiles use the nearest-rank method on the interval's
histogram, interpolated linearly inside the chosen bucket, so the error is bounded by
the bucket width (at most 25% of the value, typically under 12.5%). Durations of 2^40 ns
(about 18 minutes) and more share the last bucket.

Launches in sampled mode (bpf/ingero.bpf.c, LAUNCH_PROBE) come in two parts: their count
per (pid, op, stream) at entry, exact, and the timed sample of them, each timed launch
weighted by the 2^shift launches it stands for (its count, total, errors and histogram
slot). A row's count is the exact one; its total and errors are the sample's, scaled by
the exact count over the sample's weighted count (a ratio estimate: unbiased, its error
that of a sample of the timed launches' size); its percentiles are the weighted sample's.
A launch attached with a return (``--launch-returns all``, or an offset a session link
could not take) is timed every call, as every other op is, and joins the same row.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from ingero.trace.ops import OPS, op_name

Key = tuple[int, int]  # (pid, op id)
StreamKey = tuple[int, int]  # (pid, stream handle)
LaunchKey = tuple[int, int, int | None]  # (pid, op id, stream handle; None: names none)
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
    # Sampled launches: the timed ones per (pid, op), weighted (count, total_ns, errors and
    # histogram in launches they stand for; ``bytes``: how many were timed), and every
    # launch counted at entry per (pid, op, stream).
    timed: Mapping[Key, StatVal] = field(default_factory=dict)
    timed_hist: Mapping[Key, Histogram] = field(default_factory=dict)
    entries: Mapping[LaunchKey, int] = field(default_factory=dict)

    def pids(self) -> set[int]:
        """The processes with calls in this snapshot."""
        return {pid for pid, _ in self.stats} | {pid for pid, _, _ in self.entries}


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


def _entry_deltas(prev: Snapshot, cur: Snapshot) -> dict[LaunchKey, int]:
    """Launches counted at entry in the interval, per (pid, op, stream)."""
    out = {}
    for key, c in cur.entries.items():
        d = _minus(c, prev.entries.get(key, 0))
        if d:
            out[key] = d
    return out


@dataclass(frozen=True)
class OpInterval:
    """One (pid, op) over an interval: the exact count, the estimated total and errors,
    the histogram the percentiles come from, and how many calls were timed."""

    stat: StatVal
    hist: Histogram
    timed: int


def op_intervals(prev: Snapshot, cur: Snapshot) -> dict[Key, OpInterval]:
    """Each (pid, op) with calls in the interval, its timed and entry-counted parts joined
    (the module's docstring says how)."""
    pairs = diff_stats(prev.stats, cur.stats)
    timed = diff_stats(prev.timed, cur.timed)
    entered: dict[Key, int] = {}
    for (pid, op_id, _), d in _entry_deltas(prev, cur).items():
        entered[(pid, op_id)] = entered.get((pid, op_id), 0) + d
    out = {}
    for key in sorted(set(pairs) | set(entered)):
        p, e = pairs.get(key, StatVal()), entered.get(key, 0)
        h = diff_hist(prev.hist.get(key, {}), cur.hist.get(key, {}))
        t = timed.get(key)
        if not e or t is None or t.count <= 0:
            # No launch counted at entry, or none of them timed in the interval: the timed
            # calls (with returns) are all there is; an untimed count adds no time.
            out[key] = OpInterval(StatVal(p.count + e, p.total_ns, p.errors, p.bytes), h, p.count)
            continue
        th = diff_hist(prev.timed_hist.get(key, {}), cur.timed_hist.get(key, {}))
        # The timed sample stands for t.count launches, e were counted: scaled by e / t.count.
        # In the histogram the calls with returns weigh t.count each and the sample's e each
        # (integers: the proportions of e / t.count, exactly).
        merged = {s: n * t.count for s, n in h.items()}
        for slot, n in th.items():
            merged[slot] = merged.get(slot, 0) + n * e
        out[key] = OpInterval(
            StatVal(
                p.count + e,
                p.total_ns + round(t.total_ns * e / t.count),
                p.errors + round(t.errors * e / t.count),
                p.bytes,
            ),
            merged,
            p.count + t.bytes,
        )
    return out


def interval_rows(
    prev: Snapshot,
    cur: Snapshot,
    ts_start: float,
    ts_end: float,
    tags: Mapping[int, Tags],
) -> list[dict[str, object]]:
    """Rows for the ``intervals`` table: one per (pid, op) that had calls in the interval."""
    rows: list[dict[str, object]] = []
    for (pid, op_id), o in op_intervals(prev, cur).items():
        d, h = o.stat, o.hist
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
    # Launches counted at entry (sampled mode) that name a stream: that stream's launches.
    entered: dict[StreamKey, int] = {}
    for (pid, _, handle), d in _entry_deltas(prev, cur).items():
        if handle is not None:
            entered[(pid, handle)] = entered.get((pid, handle), 0) + d
    for pid, handle in sorted(set(cur.streams) | set(entered)):
        c = cur.streams.get((pid, handle), StreamVal())
        p = prev.streams.get((pid, handle), StreamVal())
        if c.syncs < p.syncs or c.launches < p.launches:
            p = StreamVal()  # the entry was deleted and re-created: it counts from zero
        syncs = c.syncs - p.syncs
        launches = c.launches - p.launches + entered.get((pid, handle), 0)
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
