"""An inference server's steps per (process, CUDA stream): which stream decodes, and how
fast its decode steps run (pure).

The tracer times each stream's steps, the gaps from one stream sync's return to the next
(``stream_intervals``, node DB version 6), as a log-linear histogram. Of a server's process
tree, the decode stream is the stream with the most syncs (a server keeps the one it has
while another leads by less than ``SWITCH_MARGIN``): a decode step is one host wait for the
sampled tokens, and decode steps far outnumber prefill ones. On an engine that
prefills and decodes on one stream its step times are bimodal, prefill long and decode
short: :func:`split_steps` splits them by 2-means on log step time (the split between
histogram buckets that leaves the least squared distance to the two means, which for one
dimension is exhaustive and exact) and keeps the split only where the two means are at
least ``SPLIT_RATIO`` apart; the short side is decode. The decode step rate is 1 / the mean
decode step time: how fast one decode step runs, whatever the load.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from ingero.nodedb.window import StreamWindow
from ingero.trace.aggregate import NSLOTS, slot_bounds

# Two modes whose mean step times are at least this far apart are prefill and decode; closer
# ones are one mode's spread (jitter, batch sizes), not two kinds of step.
SPLIT_RATIO = 4.0
# A server's decode stream stays its decode stream until another stream of its tree has more
# than this many times its syncs: close counts are noise, and each change of stream starts
# the server's baseline again (ingero.push.servers).
SWITCH_MARGIN = 1.25


@dataclass(frozen=True)
class Split:
    """A stream's steps, split into decode (the short mode) and prefill (the long one)."""

    decode_steps: int
    decode_ns: float  # their total time (exact where unsplit; see split_steps where split)
    prefill_steps: int = 0
    threshold_ns: int | None = None  # the shortest prefill step's bucket start; None: unsplit

    @property
    def decode_step_ns(self) -> float:
        return self.decode_ns / self.decode_steps if self.decode_steps else 0.0


def _valid(slot: int) -> bool:
    return 0 <= slot < 4 or 8 <= slot < NSLOTS


def _mid(slot: int) -> float:
    lo, hi = slot_bounds(slot)
    return max((lo + hi) / 2.0, 1.0)


def split_steps(hist: Mapping[int, int], total_ns: int | None = None) -> Split | None:
    """Decode and prefill steps of a step-time histogram (slot → count); None: no steps.
    ``total_ns``: the steps' exact total time, used where the histogram is not split. Slots
    the tracer never writes (4 to 7, past the last) are left out."""
    items = sorted((slot, n) for slot, n in hist.items() if n > 0 and _valid(slot))
    if not items:
        return None
    steps = sum(n for _, n in items)
    logs = [(math.log(_mid(slot)), n) for slot, n in items]
    best: tuple[float, int, float, float] | None = None  # (cost, cut, left mean, right mean)
    for cut in range(1, len(items)):
        left, right = logs[:cut], logs[cut:]
        nl, nr = sum(n for _, n in left), sum(n for _, n in right)
        ml = sum(x * n for x, n in left) / nl
        mr = sum(x * n for x, n in right) / nr
        cost = sum(n * (x - ml) ** 2 for x, n in left) + sum(n * (x - mr) ** 2 for x, n in right)
        if best is None or cost < best[0]:
            best = (cost, cut, ml, mr)
    if best is None or best[3] - best[2] < math.log(SPLIT_RATIO):
        exact = total_ns if total_ns is not None and total_ns > 0 else None
        whole = exact if exact is not None else sum(_mid(s) * n for s, n in items)
        return Split(steps, float(whole))
    cut = best[1]
    decode, prefill = items[:cut], items[cut:]
    # The decode time is the exact total less the prefill steps at their buckets' midpoints,
    # kept within what the decode buckets allow: where decode steps take most of the time
    # (the usual case) this is far closer than their own midpoints, whose error jumps by a
    # bucket's width as steps cross a bucket boundary; replicas with the same prefill steps
    # share the prefill estimate's error, so their decode times compare.
    lowest = sum(max(slot_bounds(s)[0], 1) * n for s, n in decode)  # a step is 1 ns or more
    highest = sum(slot_bounds(s)[1] * n for s, n in decode)
    decode_ns = sum(_mid(s) * n for s, n in decode)
    if total_ns is not None and total_ns > 0:
        estimate = total_ns - sum(_mid(s) * n for s, n in prefill)
        decode_ns = min(max(estimate, float(lowest)), float(highest))
    return Split(
        decode_steps=sum(n for _, n in decode),
        decode_ns=decode_ns,
        prefill_steps=sum(n for _, n in prefill),
        threshold_ns=slot_bounds(prefill[0][0])[0],
    )


def decode_stream(
    streams: Mapping[tuple[int, str], StreamWindow],
    pids: Collection[int],
    held: tuple[int, str] | None = None,
) -> tuple[tuple[int, str], StreamWindow] | None:
    """The stream of ``pids`` with the most syncs (ties: more steps, then the lower key);
    None where none of them synced a stream. ``held``: the decode stream so far, kept
    unless another has more than ``SWITCH_MARGIN`` times its syncs (two streams with close
    counts would otherwise trade the lead window by window)."""
    mine = [(k, s) for k, s in streams.items() if k[0] in pids and s.syncs > 0]
    if not mine:
        return None
    lead = min(mine, key=lambda ks: (-ks[1].syncs, -ks[1].steps, ks[0]))
    if held is not None and held[0] in pids:
        kept = streams.get(held)
        if kept is not None and kept.syncs > 0 and lead[1].syncs <= SWITCH_MARGIN * kept.syncs:
            return held, kept
    return lead


def decode_steps(
    streams: Mapping[tuple[int, str], StreamWindow],
    pids: Collection[int],
    held: tuple[int, str] | None = None,
) -> tuple[tuple[int, str], float] | None:
    """The decode stream of ``pids`` (``held``: see :func:`decode_stream`) and its decode
    steps per second of step time; None where it timed no step."""
    found = decode_stream(streams, pids, held)
    if found is None:
        return None
    split = split_steps(found[1].hist, found[1].step_ns)
    if split is None or split.decode_step_ns <= 0:
        return None
    return found[0], 1e9 / split.decode_step_ns


def decode_step_rate(
    streams: Mapping[tuple[int, str], StreamWindow], pids: Collection[int]
) -> float | None:
    """Decode steps per second of step time on the decode stream of ``pids``; None where it
    timed no step."""
    found = decode_steps(streams, pids)
    return found[1] if found is not None else None
