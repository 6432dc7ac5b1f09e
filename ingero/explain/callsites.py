"""Call sites: where in the job's code the sampled CUDA and NCCL calls came from.

Pure: takes the window's sampled calls grouped by (source, op, pid, stack) (``SiteSample``),
every sampled call of each (source, op, pid) with or without a stack (``SampledTotal``), the
interval totals of the same (``OpTotal``) and the stacks, and ranks the call sites.

The tracer writes 1 in N calls as a raw event (and slow calls too), so a stack's own sample
count says little on its own; its share of its op's samples (by count, and by sampled
duration) times what ``intervals`` counted for that op and process gives its estimated calls
and CUDA time. Where ``intervals`` has no row for the op, the samples are the estimate.

How a stack is named in one line (``where``): its innermost frames of the job's own code,
so a call from PyTorch's Python layers reads as the line of the model that led there:
Python frames outside site-packages, dist-packages and the standard library first; else the
innermost Python frames; else native frames.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ingero.schema.stacks import Frame, Stack

# A call site holding at least this share of its op's CUDA time in the window dominates it:
# the fix hint names its line.
DOMINANT_SHARE: Final = 0.5
# Python frames named per call site in one line.
WHERE_DEPTH: Final = 2
_LIBRARY = re.compile(r"(^<frozen |/site-packages/|/dist-packages/|/lib/python3\.\d+/)")


@dataclass(frozen=True)
class SiteSample:
    """The window's sampled calls of one (source, op, pid) from one stack."""

    source: str
    op: str
    pid: int
    stack_key: str
    samples: int
    sampled_ns: int


@dataclass(frozen=True)
class SampledTotal:
    """Every sampled call of one (source, op, pid) in the window, with a stack or not."""

    source: str
    op: str
    pid: int
    samples: int
    sampled_ns: int


@dataclass(frozen=True)
class OpTotal:
    """What ``intervals`` counted for one (source, op, pid) in the window."""

    source: str
    op: str
    pid: int
    count: int
    total_ns: int


@dataclass(frozen=True)
class CallSite:
    """One stack's share of one op: estimated calls and CUDA time, and the samples behind."""

    source: str
    op: str
    stack_key: str
    stack: Stack
    calls: int  # estimated from the op's interval count
    time_ns: int  # estimated from the op's interval total
    samples: int  # sampled calls behind the estimate
    share: float  # of the op's time in the same processes (0..1)
    pids: tuple[int, ...] = ()
    wall_share: float | None = None  # of the traced processes' wall time, where known

    @property
    def dominant(self) -> bool:
        return self.share >= DOMINANT_SHARE

    def where(self) -> str:
        return where(self.stack)

    def text(self) -> str:
        """``5,417 cuMemAlloc in `allocate` at `model.py:88` ← `forward` at `model.py:141```."""
        return f"{self.calls:,} {self.op} {where(self.stack)}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "op": self.op,
            "stack_key": self.stack_key,
            "calls": self.calls,
            "time_ns": self.time_ns,
            "samples": self.samples,
            "share": round(self.share, 4),
            "wall_share": None if self.wall_share is None else round(self.wall_share, 4),
            "pids": list(self.pids),
            "where": where(self.stack),
            "stack": self.stack.to_json(),
        }


@dataclass(frozen=True)
class SiteData:
    """The recent window's sampled calls by stack, as the reader gives them."""

    samples: tuple[SiteSample, ...] = ()
    sampled: tuple[SampledTotal, ...] = ()
    totals: tuple[OpTotal, ...] = ()
    stacks: Mapping[str, Stack] = field(default_factory=dict)
    wall_ns: float | None = None  # the traced processes' wall time in the window

    @property
    def empty(self) -> bool:
        return not self.samples


def user_frames(stack: Stack) -> tuple[Frame, ...]:
    """The frames that name the job's code: see the module's docstring."""
    py = stack.python()
    own = tuple(f for f in py if not (f.file and _LIBRARY.search(f.file)))
    return own or py or stack.frames


def short_file(path: str) -> str:
    """The last two parts of a path: ``data/loader.py`` for ``/home/u/proj/data/loader.py``."""
    parts = [p for p in path.split("/") if p]
    return "/".join(parts[-2:]) if parts else path


def frame_text(f: Frame) -> str:
    """```forward` at `model.py:141``` (Python) or ```cudaMalloc` (libcudart.so.13)``."""
    fn = f"`{f.function or '??'}`"
    if f.kind == "py":
        where = short_file(f.file or "?") + (f":{f.line}" if f.line is not None else "")
        return f"{fn} at `{where}`"
    lib = (f.lib or "?").rsplit("/", 1)[-1]
    return f"{fn} ({lib})"


def where(stack: Stack, depth: int = WHERE_DEPTH) -> str:
    """``in `allocate` at `model.py:88` ← `forward` at `model.py:141```; the reason when no
    frame was read."""
    chosen = user_frames(stack)[:depth]
    if not chosen:
        return f"(no frames: {stack.reason})" if stack.reason else "(no frames)"
    return "in " + " ← ".join(frame_text(f) for f in chosen)


def call_sites(
    data: SiteData,
    ops: Collection[tuple[str | None, str]] | None = None,
    pids: Collection[int] | None = None,
    limit: int = 3,
) -> list[CallSite]:
    """The call sites of ``ops`` ((source or None for any, op)) in ``pids`` (None: all),
    most CUDA time first, at most ``limit``."""

    def wanted(source: str, op: str, pid: int) -> bool:
        if pids is not None and pid not in pids:
            return False
        return ops is None or (source, op) in ops or (None, op) in ops

    totals = {(t.source, t.op, t.pid): t for t in data.totals}
    sampled = {(t.source, t.op, t.pid): t for t in data.sampled}
    calls: dict[tuple[str, str, str], float] = defaultdict(float)
    time_ns: dict[tuple[str, str, str], float] = defaultdict(float)
    samples: dict[tuple[str, str, str], int] = defaultdict(int)
    site_pids: dict[tuple[str, str, str], set[int]] = defaultdict(set)
    op_time: dict[tuple[str, str], float] = defaultdict(float)
    seen_ops: set[tuple[str, str, int]] = set()
    for s in data.samples:
        if not wanted(s.source, s.op, s.pid) or s.stack_key not in data.stacks:
            continue
        key3 = (s.source, s.op, s.pid)
        c_est, t_est = _estimate(s, sampled.get(key3), totals.get(key3))
        site = (s.source, s.op, s.stack_key)
        calls[site] += c_est
        time_ns[site] += t_est
        samples[site] += s.samples
        site_pids[site].add(s.pid)
        if key3 not in seen_ops:
            seen_ops.add(key3)
            op_time[(s.source, s.op)] += _op_time(sampled.get(key3), totals.get(key3))
    out = []
    for site, t in time_ns.items():
        source, op, key = site
        whole = op_time[(source, op)]
        out.append(
            CallSite(
                source=source,
                op=op,
                stack_key=key,
                stack=data.stacks[key],
                calls=round(calls[site]),
                time_ns=round(t),
                samples=samples[site],
                share=min(1.0, t / whole) if whole > 0 else 0.0,
                pids=tuple(sorted(site_pids[site])),
                wall_share=t / data.wall_ns if data.wall_ns else None,
            )
        )
    out.sort(key=lambda c: (-c.time_ns, -c.calls, c.op, c.stack_key))
    return out[:limit]


def _estimate(
    s: SiteSample, sampled: SampledTotal | None, total: OpTotal | None
) -> tuple[float, float]:
    """(calls, time_ns) of one process's share of one op from one stack."""
    if sampled is None or sampled.samples <= 0 or total is None:
        return float(s.samples), float(s.sampled_ns)
    by_count = s.samples / sampled.samples
    by_time = s.sampled_ns / sampled.sampled_ns if sampled.sampled_ns > 0 else by_count
    return total.count * by_count, total.total_ns * by_time


def _op_time(sampled: SampledTotal | None, total: OpTotal | None) -> float:
    """One process's time in one op, on the scale ``_estimate`` uses."""
    if sampled is None or sampled.samples <= 0 or total is None:
        return float(sampled.sampled_ns) if sampled is not None else 0.0
    return float(total.total_ns)


def ops_of(evidence: Mapping[str, Any]) -> list[tuple[str | None, str]]:
    """The calls a signal's evidence is about: ``op`` (with ``source``) or ``ops``."""
    source = evidence.get("source")
    src = source if isinstance(source, str) else None
    found: list[tuple[str | None, str]] = []
    if isinstance(evidence.get("op"), str):
        found.append((src, evidence["op"]))
    ops = evidence.get("ops")
    if isinstance(ops, list):
        found += [(src, o) for o in ops if isinstance(o, str)]
    return found
