"""``ingero export``: node DB rows as a Trace Event Format timeline (ui.perfetto.dev, chrome://tracing).

Pure: takes each node's rows (``NodeData``) and the straggler episodes/drains, returns the
trace object and the warnings to print. Layout:

- one process track per node (``pid`` 1..N, named after the node), sorted by name;
- a thread track per traced process (``tid`` = its PID; named with rank, PID and comm),
  holding its sampled CUDA and NCCL calls as complete events (``ph: X``) that start at
  return time minus duration;
- counters (``ph: C``) per interval: calls per second of each op per process, and the
  node's off-CPU seconds per second, page allocations, block I/O p99 and TCP retransmits,
  and GPU busy where recorded;
- thread 0 of each node, "ingero events": straggler episodes and drains as slices;
- NCCL collectives (``nccl_calls`` where the node DB has it, v3, and the sampled NCCL
  ``raw_events`` not among them), from arrival to return; one still in flight when written
  lasts to the end of the trace. The ranks' calls of one collective (``join_collectives``:
  one communicator and sequence number, or the i-th call of each rank for node DBs older
  than v3) carry the same ``collective`` argument and are chained by flow events.
- a call with a call stack (node DB v4: ``stack_key`` into ``stacks``) carries its frames,
  innermost first, as the ``stack`` argument (one label per frame: ``forward at
  model.py:141``, ``cudaMalloc (libcudart.so.12)``) with ``stack_key``, and as the Trace Event
  Format's own stack: ``sf`` naming the innermost frame of the top-level ``stackFrames``
  (each frame's ``parent`` is its caller), which chrome://tracing shows under the slice.

Clocks: a node's measured offset (``merged_nodes.clock_offset_s``, measured by
``merge``/``export --nodes``) is subtracted from its times. Where none is known, the offset
is estimated from the collectives it shares with other nodes, joined as above (all ranks
leave an all-reduce together) and applied. Nodes whose clocks disagree by more than
``CLOCK_WARN_S`` are named in a warning.
"""

from __future__ import annotations

import json
import statistics
import zlib
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ingero.explain.chains import CollectiveCall, join_collectives
from ingero.explain.reader import (
    collective,
    numbered_collective,
    sampled_collectives,
)
from ingero.schema.stacks import Stack, StackError, loads

CLOCK_WARN_S: Final = 0.1
FORMATS: Final = ("perfetto", "chrome")
EVENTS_TID: Final = 0


@dataclass
class NodeData:
    node: str
    tables: dict[str, tuple[list[str], list[Sequence[Any]]]] = field(default_factory=dict)
    clock_offset_s: float | None = None  # this node's clock minus the reference clock

    def rows(self, table: str) -> list[dict[str, Any]]:
        cols, rows = self.tables.get(table, ([], []))
        return [dict(zip(cols, row, strict=False)) for row in rows]


@dataclass(frozen=True)
class Slice:
    """A straggler episode or a drain on one node (from the journal or Echo)."""

    node: str
    name: str
    start: float
    end: float | None  # None: still open at the end of the trace
    args: Mapping[str, Any] = field(default_factory=dict)


def _raw_collective(node: str, r: Mapping[str, Any]) -> CollectiveCall | None:
    if r.get("source") != "nccl":
        return None
    return collective(
        r.get("ts"), r.get("duration_ns"), r.get("pid"), r.get("rank"), r.get("op"),
        r.get("detail"), node=node,
    )  # fmt: skip


def _numbered(n: NodeData) -> list[tuple[CollectiveCall, dict[str, Any]]]:
    """The node's ``nccl_calls`` rows (none before node DB v3) as calls, with their row."""
    out = []
    for r in n.rows("nccl_calls"):
        if (call := numbered_collective(r, node=n.node)) is not None:
            out.append((call, r))
    return out


def _collectives(nodes: Sequence[NodeData]) -> list[CollectiveCall]:
    """Every node's collectives: ``nccl_calls``, and the NCCL raw events not among them."""
    calls = []
    for n in nodes:
        raw = [c for r in n.rows("raw_events") if (c := _raw_collective(n.node, r)) is not None]
        calls += sampled_collectives((c for c, _ in _numbered(n)), raw)
    return calls


def align_collectives(calls: Iterable[CollectiveCall]) -> dict[CollectiveCall, str]:
    """Collective id of each call (``join_collectives``): communicator, op and number."""
    return {
        c: f"{comm[:8]}:{op}:{n}"
        for (comm, op, n), members in join_collectives(calls).items()
        for c in members.values()
    }


def estimate_offsets(
    calls: Sequence[CollectiveCall], ids: Mapping[CollectiveCall, str]
) -> dict[str, float]:
    """Each node's clock offset judged by the collectives it shares (median return-time gap
    to the median of all ranks); nodes with no shared collective are left out."""
    ends: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for c in calls:
        if c.node is not None and c.returned and c in ids:
            ends[ids[c]].append((c.node, c.ts))
    gaps: dict[str, list[float]] = defaultdict(list)
    for members in ends.values():
        if len({n for n, _ in members}) < 2:
            continue
        mid = statistics.median(t for _, t in members)
        for node, t in members:
            gaps[node].append(t - mid)
    return {node: statistics.median(g) for node, g in gaps.items()}


def _us(ts: float, t0: float) -> float:
    return round((ts - t0) * 1e6, 3)


def build_trace(
    nodes: Sequence[NodeData], slices: Sequence[Slice] = (), fmt: str = "perfetto"
) -> tuple[dict[str, Any], list[str]]:
    """The Trace Event Format object and the warnings (clock disagreement) to show."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}")
    nodes = sorted(nodes, key=lambda n: n.node)
    calls = _collectives(nodes)
    ids = align_collectives(calls)
    offsets = _offsets(nodes, estimate_offsets(calls, ids))
    warnings = _clock_warnings(nodes, offsets)
    numbered = {n.node: _numbered(n) for n in nodes}
    clock = _Clock(offsets, _t0(nodes, numbered, slices, offsets))
    events: list[dict[str, Any]] = []
    pid_of = {n.node: i for i, n in enumerate(nodes, 1)}
    flows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    in_flight: list[dict[str, Any]] = []  # collectives not returned: drawn to the end
    # a raw event of a collective nccl_calls holds is drawn from there (arrival, in flight)
    in_table = {(c.node, c.pid, c.comm_hash, c.seq) for v in numbered.values() for c, _ in v}
    frames = _Frames()
    for n in nodes:
        pid = pid_of[n.node]
        stacks = _stacks(n)
        events += _tracks(n, pid)
        events += frames.attach(_raw_calls(n, pid, clock, ids, in_table, flows), stacks)
        events += frames.attach(
            _numbered_calls(n, pid, clock, numbered[n.node], ids, flows, in_flight), stacks
        )
        events += _call_rates(n, pid, clock)
        events += _host_counters(n, pid, clock)
        events += _gpu_counters(n, pid, clock)
        events += _marks(n, pid, clock, in_flight)
    end_of_trace = max((e["ts"] + e.get("dur", 0) for e in events if "ts" in e), default=0.0)
    for e in in_flight:
        e["dur"] = round(max(0.0, end_of_trace - e["ts"]), 3)
    events += _slices(slices, pid_of, clock.t0, end_of_trace)
    events += _flows(flows)
    trace = {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "producer": "ingero export",
            "format": fmt,
            "t0_unix_s": clock.t0,
            "clock_offsets_s": {k: round(v, 6) for k, v in sorted(offsets.items())},
        },
    }
    if frames.table:
        trace["stackFrames"] = frames.table
    return trace, warnings


def _stacks(n: NodeData) -> dict[str, Stack]:
    """The node's stacks by key; a row that does not decode is left out (no frames shown)."""
    out = {}
    for r in n.rows("stacks"):
        try:
            out[str(r["stack_key"])] = loads(str(r["frames"]))
        except (StackError, KeyError):
            continue
    return out


@dataclass
class _Frames:
    """The trace's ``stackFrames``: each stack's frames once, each frame's parent its caller.

    Frame ids are numbers (as strings for the JSON object's keys), as the format's own
    examples write them; a stack's frames get consecutive ids, innermost first.
    """

    table: dict[str, dict[str, Any]] = field(default_factory=dict)
    first: dict[str, int] = field(default_factory=dict)  # stack key -> its innermost frame

    def attach(
        self, events: list[dict[str, Any]], stacks: Mapping[str, Stack]
    ) -> list[dict[str, Any]]:
        """Give each event whose ``args.stack_key`` is known its frames (``args.stack``, ``sf``)."""
        for e in events:
            key = e["args"].get("stack_key")
            stack = stacks.get(key) if isinstance(key, str) else None
            if stack is None:
                continue
            e["args"]["stack"] = [f.label() for f in stack.frames]
            if stack.reason:
                e["args"]["stack_reason"] = stack.reason
            if stack.frames:
                e["sf"] = self.add(key, stack)
        return events

    def add(self, key: str, stack: Stack) -> int:
        """The id of the stack's innermost frame (the same stack key, the same frames)."""
        if key in self.first:
            return self.first[key]
        base = self.first[key] = len(self.table)
        n = len(stack.frames)
        for i, f in enumerate(stack.frames):
            entry: dict[str, Any] = {"name": f.label(), "category": f.lib or f.file or f.kind}
            if i + 1 < n:
                entry["parent"] = str(base + i + 1)
            self.table[str(base + i)] = entry
        return base


def _offsets(nodes: Sequence[NodeData], estimated: Mapping[str, float]) -> dict[str, float]:
    """Each node's clock offset: measured where known; else judged by shared collectives,
    relative to the measured nodes' frame (their corrected collectives sit at the median)."""
    offsets = {n.node: n.clock_offset_s for n in nodes if n.clock_offset_s is not None}
    # Estimates are relative to the ranks' median, measurements to this host: shift the
    # estimates into the measured frame by the nodes that have both.
    both = [estimated[k] - offsets[k] for k in offsets if k in estimated]
    base = statistics.median(both) if both else 0.0
    for node, est in estimated.items():
        offsets.setdefault(node, est - base)
    for n in nodes:
        offsets.setdefault(n.node, 0.0)
    return offsets


def _clock_warnings(nodes: Sequence[NodeData], offsets: Mapping[str, float]) -> list[str]:
    """A warning naming the two nodes whose clocks disagree most, past CLOCK_WARN_S."""
    if len(offsets) <= 1:
        return []
    lo = min(offsets, key=lambda k: offsets[k])
    hi = max(offsets, key=lambda k: offsets[k])
    spread = offsets[hi] - offsets[lo]
    if spread <= CLOCK_WARN_S:
        return []
    how = {
        k: "measured"
        if any(n.node == k and n.clock_offset_s is not None for n in nodes)
        else "from NCCL collectives"
        for k in (lo, hi)
    }
    return [
        f"nodes' clocks disagree by {spread * 1e3:.0f} ms ({hi} {offsets[hi] * 1e3:+.0f}"
        f" ms, {how[hi]}; {lo} {offsets[lo] * 1e3:+.0f} ms, {how[lo]}):"
        " offsets applied to the timeline"
    ]


@dataclass(frozen=True)
class _Clock:
    """A node's times in the reference clock, as microseconds since ``t0``."""

    offsets: Mapping[str, float]
    t0: float

    def local(self, node: str, ts: float) -> float:
        return ts - self.offsets[node]

    def us(self, node: str, ts: float) -> float:
        return _us(self.local(node, ts), self.t0)


def _t0(
    nodes: Sequence[NodeData],
    numbered: Mapping[str, list[tuple[CollectiveCall, dict[str, Any]]]],
    slices: Sequence[Slice],
    offsets: Mapping[str, float],
) -> float:
    """The earliest start of anything drawn, in the reference clock."""
    starts = [
        float(r["ts"]) - float(r.get("duration_ns") or 0) / 1e9 - offsets[n.node]
        for n in nodes
        for r in n.rows("raw_events")
    ]
    starts += [c.arrival - offsets[c.node or ""] for v in numbered.values() for c, _ in v]
    starts += [
        float(r["ts_start"]) - offsets[n.node]
        for n in nodes
        for t in ("intervals", "host_intervals", "gpu_intervals", "marks")
        for r in n.rows(t)
    ]
    starts += [s.start for s in slices]
    return min(starts) if starts else 0.0


def _tracks(n: NodeData, pid: int) -> list[dict[str, Any]]:
    """The node's process track and its threads: "ingero events", one per traced process."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": n.node}},
        {
            "ph": "M",
            "name": "process_sort_index",
            "pid": pid,
            "tid": 0,
            "args": {"sort_index": pid},
        },
        {
            "ph": "M",
            "name": "thread_name",
            "pid": pid,
            "tid": EVENTS_TID,
            "args": {"name": "ingero events"},
        },
    ]
    procs = {int(p["pid"]): p for p in n.rows("processes")}
    tids = {
        int(r["pid"]) for t in ("raw_events", "intervals", "nccl_calls", "marks") for r in n.rows(t)
    }
    for tid in sorted(tids):
        p = procs.get(tid, {})
        rank = p.get("rank")
        label = (
            (f"rank {rank} · " if rank is not None else "")
            + f"pid {tid}"
            + (f" ({p['comm']})" if p.get("comm") else "")
        )
        events.append(
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": label}}
        )
        events.append(
            {
                "ph": "M",
                "name": "thread_sort_index",
                "pid": pid,
                "tid": tid,
                "args": {"sort_index": rank if isinstance(rank, int) else tid},
            }
        )
    return events


def _marks(
    n: NodeData, pid: int, clock: _Clock, in_flight: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """What the job marked (node DB v5), on its process's track: a phase is a slice (one
    still open is drawn to the end of the trace), a step or a label an instant."""
    events = []
    for r in n.rows("marks"):
        args: dict[str, Any] = {}
        if r.get("labels"):
            try:
                args.update(json.loads(str(r["labels"])))
            except ValueError:
                args["labels"] = r["labels"]
        if r.get("step") is not None:
            args["step"] = r["step"]
        ts = _us(clock.local(n.node, float(r["ts_start"])), clock.t0)
        kind = str(r["kind"])
        event: dict[str, Any] = {
            "name": f"step {r['step']}" if kind == "step" and r.get("step") is not None
            else str(r["name"]),
            "cat": f"mark.{kind}",
            "ts": ts,
            "pid": pid,
            "tid": int(r["pid"]),
            "args": args,
        }  # fmt: skip
        if kind == "phase":
            event["ph"] = "X"
            if r.get("ts_end") is None:
                event["dur"] = 0.0
                in_flight.append(event)
            else:
                end = _us(clock.local(n.node, float(r["ts_end"])), clock.t0)
                event["dur"] = round(max(0.0, end - ts), 3)
        else:
            event["ph"] = "i"
            event["s"] = "t"
        events.append(event)
    return events


def _raw_calls(
    n: NodeData,
    pid: int,
    clock: _Clock,
    ids: Mapping[CollectiveCall, str],
    in_table: set[tuple[str | None, int, str, int | None]],
    flows: dict[str, list[dict[str, Any]]],
) -> list[dict[str, Any]]:
    """The sampled calls (``raw_events``) as slices, but the collectives nccl_calls holds."""
    events = []
    for r in n.rows("raw_events"):
        call = _raw_collective(n.node, r)
        if call is not None and (n.node, call.pid, call.comm_hash, call.seq) in in_table:
            continue
        dur_ns = int(r.get("duration_ns") or 0)
        args: dict[str, Any] = {"ret": r.get("ret"), "bytes": r.get("bytes")}
        if r.get("stack_key") is not None:
            args["stack_key"] = str(r["stack_key"])
        if r.get("detail"):
            try:
                args.update(json.loads(str(r["detail"])))
            except ValueError:
                args["detail"] = r["detail"]
        event = {
            "ph": "X",
            "name": str(r["op"]),
            "cat": str(r["source"]),
            "ts": _us(clock.local(n.node, float(r["ts"])) - dur_ns / 1e9, clock.t0),
            "dur": round(dur_ns / 1e3, 3),
            "pid": pid,
            "tid": int(r["pid"]),
            "args": args,
        }
        if call is not None and (cid := ids.get(call)) is not None:
            args["collective"] = cid
            flows[cid].append(event)
        events.append(event)
    return events


def _numbered_calls(
    n: NodeData,
    pid: int,
    clock: _Clock,
    numbered: list[tuple[CollectiveCall, dict[str, Any]]],
    ids: Mapping[CollectiveCall, str],
    flows: dict[str, list[dict[str, Any]]],
    in_flight: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """The node's ``nccl_calls`` as slices from arrival; one not returned is in flight."""
    events = []
    for call, r in numbered:
        args = {
            k: r.get(k)
            for k in ("comm_hash", "comm_rank", "nranks", "seq", "bytes", "ret", "stack_key")
            if r.get(k) is not None
        }
        event = {
            "ph": "X",
            "name": call.op,
            "cat": "nccl",
            "ts": clock.us(n.node, call.arrival),
            "dur": round(call.duration_ns / 1e3, 3),
            "pid": pid,
            "tid": call.pid,
            "args": args,
        }
        if not call.returned:
            args["in_flight"] = True
            in_flight.append(event)
        if (cid := ids.get(call)) is not None:
            args["collective"] = cid
            flows[cid].append(event)
        events.append(event)
    return events


def _call_rates(n: NodeData, pid: int, clock: _Clock) -> list[dict[str, Any]]:
    """Calls per second of each op, per process and interval (``intervals``)."""
    by_tick: dict[tuple[int, float, float], dict[str, float]] = defaultdict(dict)
    for r in n.rows("intervals"):
        span = float(r["ts_end"]) - float(r["ts_start"])
        if span > 0:
            key = (int(r["pid"]), float(r["ts_start"]), float(r["ts_end"]))
            by_tick[key][str(r["op"])] = round(int(r["count"]) / span, 3)
    return [
        {
            "ph": "C",
            "name": f"calls/s pid {tid}",
            "pid": pid,
            "tid": tid,
            "ts": clock.us(n.node, a),
            "args": rates,
        }
        for (tid, a, _), rates in sorted(by_tick.items())
    ]


def _host_counters(n: NodeData, pid: int, clock: _Clock) -> list[dict[str, Any]]:
    """The node's off-CPU time, page allocations, block I/O p99 and TCP retransmits."""
    events = []
    for r in n.rows("host_intervals"):
        a, b = float(r["ts_start"]), float(r["ts_end"])
        if b <= a:
            continue
        values = {
            "off-CPU s/s": round((r.get("offcpu_ns") or 0) / 1e9 / (b - a), 4),
            "page allocs/s": round((r.get("page_allocs") or 0) / (b - a), 1),
            "block I/O p99 ms": round((r.get("block_io_p99_ns") or 0) / 1e6, 3),
            "TCP retransmits": int(r.get("tcp_retransmits") or 0),
        }
        for name, value in values.items():
            events.append(
                {
                    "ph": "C",
                    "name": name,
                    "pid": pid,
                    "tid": 0,
                    "ts": clock.us(n.node, a),
                    "args": {"value": value},
                }
            )
    return events


def _gpu_counters(n: NodeData, pid: int, clock: _Clock) -> list[dict[str, Any]]:
    """Each GPU's busy fraction, where the node DB records it."""
    events = []
    for r in n.rows("gpu_intervals"):
        a, b = float(r["ts_start"]), float(r["ts_end"])
        if b > a and r.get("busy_ns") is not None:
            events.append(
                {
                    "ph": "C",
                    "name": f"GPU {r['gpu']} busy",
                    "pid": pid,
                    "tid": 0,
                    "ts": clock.us(n.node, a),
                    "args": {"fraction": round(float(r["busy_ns"]) / 1e9 / (b - a), 4)},
                }
            )
    return events


def _slices(
    slices: Sequence[Slice], pid_of: Mapping[str, int], t0: float, end_of_trace: float
) -> list[dict[str, Any]]:
    """Straggler episodes and drains on each node's "ingero events" thread."""
    events = []
    for s in slices:
        if s.node not in pid_of:
            continue
        begin = _us(s.start, t0)
        finish = _us(s.end, t0) if s.end is not None else max(end_of_trace, begin)
        events.append(
            {
                "ph": "X",
                "name": s.name,
                "cat": "ingero",
                "ts": begin,
                "dur": round(max(0.0, finish - begin), 3),
                "pid": pid_of[s.node],
                "tid": EVENTS_TID,
                "args": dict(s.args),
            }
        )
    return events


def _flows(flows: Mapping[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Flow events chaining the ranks' calls of each collective, in time order."""
    events = []
    for cid, members in flows.items():
        if len(members) < 2:
            continue
        members.sort(key=lambda e: e["ts"])
        fid = zlib.crc32(cid.encode())
        for i, e in enumerate(members):
            ph = "s" if i == 0 else "f" if i == len(members) - 1 else "t"
            # at each call's start, inside its slice, so every point binds to that call
            flow = {
                "ph": ph,
                "name": "collective",
                "cat": "nccl",
                "id": fid,
                "pid": e["pid"],
                "tid": e["tid"],
                "ts": e["ts"],
            }
            if ph != "s":
                flow["bp"] = "e"
            events.append(flow)
    return events


def slices_from_rows(rows: Iterable[Any]) -> list[Slice]:
    """Straggler episodes and drains (``ingero.journal.episodes.Row``) as slices.

    A drain lasts until the node's next resume, or to the end of the trace.
    """
    from ingero.journal.episodes import DRAIN, EPISODE, RESUME

    out: list[Slice] = []
    open_drains: dict[str, int] = {}
    for row in sorted(rows, key=lambda r: r.start):
        if row.kind == EPISODE:
            what = f"straggler ({row.signal})" if row.signal else "straggler"
            out.append(Slice(row.node_id, what, row.start, row.end, row.to_dict()))
        elif row.kind == DRAIN:
            open_drains[row.node_id] = len(out)
            out.append(Slice(row.node_id, "drained", row.start, None, row.to_dict()))
        elif row.kind == RESUME and row.node_id in open_drains:
            i = open_drains.pop(row.node_id)
            d = out[i]
            out[i] = Slice(d.node, d.name, d.start, row.start, d.args)
    return out
