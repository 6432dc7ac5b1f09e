"""Read one window of the node DB into plain values for the analysis (read-only connection).

A window holds the rows whose ``ts_end`` lies in ``(end - window, end]``, as in
``ingero.nodedb.window``; GPU busy fractions come from that module's ``read_window`` so
``explain`` and ``fleet-push`` measure the GPU the same way. The rows come from the node
DB's readers (``ingero.nodedb``: intervals, processes, marks, nccl, stacks); this module
turns them into the analysis' values.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path

import sqlite_utils

from ingero import nodedb
from ingero.collectors.nvml import DEGRADING_THROTTLE, throttle_names
from ingero.explain.analysis import GpuStats, HostStats, OpStats, ProcessInfo, WindowData
from ingero.explain.callsites import OpTotal, SampledTotal, SiteData, SiteSample
from ingero.explain.chains import (
    CollectiveCall,
    GpuPoint,
    HostPoint,
    OpPoint,
    Process,
    Timeline,
)
from ingero.explain.hung import MAX_HUNG, InFlight, RankState
from ingero.explain.phases import MAX_PHASES, Phase
from ingero.nodedb import intervals, marks, nccl, processes, stacks
from ingero.nodedb.ops import NON_COLLECTIVE_OPS
from ingero.nodedb.schema import NodeDbError
from ingero.nodedb.window import NodeDbUnavailable, read_window

DEFAULT_DB = Path(nodedb.DEFAULT_PATH)
# Distinct stacks kept per (source, op, pid) when reading call sites: the rest still count
# in their op's sampled total, so the kept ones' estimates do not move; memory stays bounded
# whatever the number of distinct stacks.
SITES_PER_OP = 50
# Ranks (process and communicator) read for hung collectives: the newest in the window.
MAX_RANK_STATES = 1000


def read_window_data(
    db: sqlite_utils.Database, path: Path, end: float, window_s: float, job_id: str | None
) -> WindowData:
    """Everything the analysis needs about ``(end - window_s, end]``; ``job_id`` filters calls."""
    start = end - window_s
    conn = db.conn
    first, last, pids = intervals.coverage(conn, start, end, job_id)
    covered = max(0.0, float(last) - float(first)) if first is not None else 0.0
    ops = tuple(
        OpStats(
            source=str(src),
            op=str(op),
            count=int(count),
            total_ns=int(total or 0),
            p50_ns=float(p50 or 0.0),
            p95_ns=float(p95 or 0.0),
            p99_ns=float(p99 or 0.0),
            errors=int(errors or 0),
        )
        for src, op, count, total, p50, p95, p99, errors in intervals.op_totals(
            conn, start, end, job_id
        )
    )
    host_row = intervals.host_totals(conn, start, end)
    host = None
    if host_row[0]:
        host = HostStats(
            covered_s=max(0.0, float(host_row[2]) - float(host_row[1])),
            offcpu_ns=int(host_row[3] or 0),
            page_allocs=int(host_row[4] or 0),
            block_io_count=int(host_row[5] or 0),
            block_io_p99_ns=None if host_row[6] is None else int(host_row[6]),
            tcp_retransmits=int(host_row[7] or 0),
            dropped_events=int(host_row[8] or 0),
        )
    try:
        aggregates = read_window(path, end, window_s)
    except NodeDbUnavailable as exc:
        raise NodeDbError(str(exc)) from None
    gpus = tuple(
        GpuStats(
            gpu=gpu,
            busy_fraction=g.busy,
            mem_free_bytes=g.mem_free_bytes,
            mem_total_bytes=g.mem_total_bytes,
            throttled_fraction=g.throttled_fraction,
            throttle_reasons=tuple(throttle_names(g.throttle_reasons)),
            xids=tuple(x for _, x in g.xids),
            ecc_uncorrected_new=g.new.get("ecc_uncorrected"),
            remap_pending=g.remap_pending,
            remap_failure=g.remap_failure,
            lost=g.lost,
            health_measured=g.health_measured,
        )
        for gpu, g in sorted(aggregates.gpus.items())
    )
    return WindowData(
        start=start,
        end=end,
        covered_s=covered,
        pids=int(pids or 0),
        ops=ops,
        host=host,
        gpus=gpus,
        busy_source=aggregates.busy_source,
        sync_busy_estimate=aggregates.sync_busy_estimate,
    )


def read_phases(
    db: sqlite_utils.Database, start: float, end: float, job_id: str | None
) -> list[Phase]:
    """The job's marked phases (node DB v5) that overlap ``(start, end]``; at most
    MAX_PHASES, the latest first. A node DB before v5 has none."""
    rows = marks.phases(db, start, end, job_id, MAX_PHASES)
    return [
        Phase(
            name=str(name),
            pid=int(pid),
            rank=None if rank is None else int(rank),
            start=float(ts_start),
            end=None if ts_end is None else float(ts_end),
        )
        for name, pid, rank, ts_start, ts_end in rows
    ]


def read_processes(db: sqlite_utils.Database, job_id: str | None) -> list[ProcessInfo]:
    """Traced processes (of ``job_id`` when given), most recently seen first, at most 50."""
    rows = processes.recent(db, job_id)
    return [
        ProcessInfo(
            pid=int(pid),
            comm=None if comm is None else str(comm),
            job_id=None if job is None else str(job),
            rank=None if rank is None else int(rank),
            last_seen=None if seen is None else float(seen),
        )
        for pid, comm, job, rank, seen in rows
    ]


# Of NVML's clocks-event bitmask (``gpu_intervals.throttle_reasons``) only the hardware
# slowdown reasons (``DEGRADING_THROTTLE``: thermal, power brake, the slowdown line) are
# throttling, as in fleet-push's GPU health: a GPU-bound job meets the software power cap on
# healthy GPUs every day.
def _throttle_detail(column: str, value: object) -> str | None:
    """``throttle_reasons=0x24 (sw_power_cap, sw_thermal_slowdown)`` when the mask holds a
    hardware slowdown, else None."""
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    if not value & DEGRADING_THROTTLE:
        return None
    return f"{column}={value:#x} ({', '.join(throttle_names(value))})"


def _xid(value: object) -> int | None:
    """The first XID number of an ``xids`` JSON list (None when empty or unreadable)."""
    if value is None or value == "":
        return None
    try:
        parsed = json.loads(str(value))
    except ValueError:
        return None
    first = parsed[0] if isinstance(parsed, list) and parsed else parsed
    return first if isinstance(first, int) and not isinstance(first, bool) and first else None


def read_timeline(
    db: sqlite_utils.Database, end: float, window_s: float, job_id: str | None
) -> Timeline:
    """Per-interval rows of ``(end - window_s, end]`` and the window before it, for chains."""
    start, split = end - 2 * window_s, end - window_s
    conn = db.conn
    ops = tuple(
        OpPoint(
            float(a),
            float(b),
            int(pid),
            str(src),
            str(op),
            int(n),
            int(tot or 0),
            float(p95 or 0.0),
            int(err or 0),
            int(nbytes or 0),
        )
        for a, b, pid, src, op, n, tot, p95, err, nbytes in intervals.op_rows(
            conn, start, end, job_id
        )
    )
    host = tuple(
        HostPoint(
            float(a),
            float(b),
            int(off or 0),
            int(pages or 0),
            int(n or 0),
            None if p99 is None else int(p99),
            int(retx or 0),
        )
        for a, b, off, pages, n, p99, retx in intervals.host_rows(conn, start, end)
    )
    throttle_cols, gpu_rows = intervals.gpu_rows(conn, start, end)
    gpus = []
    for row in gpu_rows:
        t_vals = dict(zip(throttle_cols, row[4 : 4 + len(throttle_cols)], strict=True))
        x_vals = [_xid(v) for v in row[4 + len(throttle_cols) :]]
        hot = [d for c, v in t_vals.items() if (d := _throttle_detail(c, v)) is not None]
        detail = ", ".join(hot)
        gpus.append(
            GpuPoint(
                float(row[0]),
                float(row[1]),
                int(row[2]),
                None if row[3] is None else int(row[3]),
                bool(hot),
                detail or None,
                next((x for x in x_vals if x), None),
            )
        )
    raw = []
    for ts, dur, pid, rank, op, detail in nccl.raw_calls(conn, start, end, job_id):
        call = collective(ts, dur, pid, rank, op, detail)
        if call is not None:
            raw.append(call)
    numbered = []
    for row in nccl.numbered_calls(db, start, end, job_id):  # none before node DB v3
        call = numbered_collective(dict(zip(nccl.NCCL_CALL_COLUMNS, row, strict=True)))
        if call is not None:
            numbered.append(call)
    collectives = sampled_collectives(numbered, raw)
    processes = {
        p.pid: Process(p.pid, p.comm, p.job_id, p.rank) for p in read_processes(db, job_id)
    }
    return Timeline(start, split, end, ops, host, tuple(gpus), tuple(collectives), processes)


def collective(
    ts: object,
    duration_ns: object,
    pid: object,
    rank: object,
    op: object,
    detail: object,
    node: str | None = None,
) -> CollectiveCall | None:
    """An NCCL ``raw_events`` row as a collective call, or None without a communicator."""
    try:
        info = json.loads(str(detail)) if detail else {}
    except ValueError:
        return None
    comm = info.get("comm_hash") if isinstance(info, dict) else None
    if not comm or ts is None or duration_ns is None or str(op) in NON_COLLECTIVE_OPS:
        return None
    detail_rank = info.get("rank")
    seq = info.get("seq")
    return CollectiveCall(
        ts=float(str(ts)),
        duration_ns=int(str(duration_ns)),
        pid=int(str(pid)),
        op=str(op),
        comm_hash=str(comm),
        rank=int(detail_rank)
        if isinstance(detail_rank, int)
        else (None if rank is None else int(str(rank))),
        node=node,
        seq=seq if isinstance(seq, int) and not isinstance(seq, bool) else None,
    )


def numbered_collective(
    row: Mapping[str, object], node: str | None = None
) -> CollectiveCall | None:
    """An ``nccl_calls`` row (``NCCL_CALL_COLUMNS``) as a collective call. One not returned
    when written is placed at its arrival, with no duration. Its rank is the one inside the
    communicator, as ``raw_events.detail`` gives it, else the Slurm rank tag."""
    if any(row.get(c) is None for c in ("ts_enter", "pid", "op", "comm_hash", "seq")):
        return None  # NOT NULL in the node DB; a merged or fetched row may lack one
    rank = row.get("rank") if row.get("comm_rank") is None else row.get("comm_rank")
    enter = float(str(row["ts_enter"]))
    back = None if row.get("ts_return") is None else float(str(row["ts_return"]))
    return CollectiveCall(
        ts=enter if back is None else back,
        duration_ns=0 if back is None else max(0, round((back - enter) * 1e9)),
        pid=int(str(row["pid"])),
        op=str(row["op"]),
        comm_hash=str(row["comm_hash"]),
        rank=None if rank is None else int(str(rank)),
        node=node,
        seq=int(str(row["seq"])),
        returned=back is not None,
    )


def sampled_collectives(
    numbered: Iterable[CollectiveCall], raw: Iterable[CollectiveCall]
) -> list[CollectiveCall]:
    """The ``nccl_calls`` calls, and the ``raw_events`` ones that are not among them.

    Both tables sample the same collectives (independently); ``nccl_calls`` has the arrival
    and the calls in flight, so a call in both is taken from there.
    """
    out = list(numbered)
    seen = {(c.node, c.pid, c.comm_hash, c.seq) for c in out}
    out += [c for c in raw if c.seq is None or (c.node, c.pid, c.comm_hash, c.seq) not in seen]
    return out


def read_call_sites(
    db: sqlite_utils.Database,
    end: float,
    window_s: float,
    job_id: str | None,
    wall_ns: float | None = None,
) -> SiteData:
    """The sampled calls of ``(end - window_s, end]`` by stack, for ``callsites.call_sites``.

    Calls come from ``raw_events`` (the window's newest ``SITE_ROWS``); NCCL ops with no
    stacked raw event there come from ``nccl_calls`` (their entry in the window, as many).
    Empty for a node DB without stacks (v1-v3).
    """
    if not stacks.has_stacks(db):
        return SiteData()
    start = end - window_s
    conn = db.conn
    by_op: dict[tuple[str, str, int], list[SiteSample]] = {}
    sampled: dict[tuple[str, str, int], list[int]] = {}
    _collect(stacks.raw_sites(conn, start, end, job_id), by_op, sampled)
    stacked_nccl = {k[1:] for k, v in by_op.items() if k[0] == "nccl" and v}
    rows = stacks.nccl_sites(conn, start, end, job_id)
    if rows is not None:
        extra_by: dict[tuple[str, str, int], list[SiteSample]] = {}
        extra_sampled: dict[tuple[str, str, int], list[int]] = {}
        _collect(rows, extra_by, extra_sampled)
        for k, v in extra_by.items():
            if k[1:] not in stacked_nccl and v:
                by_op[k] = v
                sampled[k] = extra_sampled[k]
    samples = tuple(s for v in by_op.values() for s in v)
    if not samples:
        return SiteData()
    totals = tuple(
        OpTotal(str(src), str(op), int(pid), int(n or 0), int(tot or 0))
        for src, op, pid, n, tot in intervals.op_pid_totals(conn, start, end, job_id)
    )
    return SiteData(
        samples=samples,
        sampled=tuple(
            SampledTotal(src, op, pid, n, ns) for (src, op, pid), (n, ns) in sampled.items()
        ),
        totals=totals,
        stacks=stacks.read_stacks(db, {s.stack_key for s in samples}),
        wall_ns=wall_ns,
    )


def _collect(
    rows: Iterable[tuple[object, ...]],
    by_op: dict[tuple[str, str, int], list[SiteSample]],
    sampled: dict[tuple[str, str, int], list[int]],
) -> None:
    """Group (source, op, pid, stack_key, samples, ns) rows: every row counts in its op's
    sampled total; the SITES_PER_OP stacks with the most sampled time are kept."""
    for src, op, pid, key, n, ns in rows:
        if src is None or op is None or pid is None:
            continue
        k = (str(src), str(op), int(str(pid)))
        total = sampled.setdefault(k, [0, 0])
        total[0] += int(str(n))
        total[1] += int(str(ns or 0))
        if key is None:
            continue
        kept = by_op.setdefault(k, [])
        kept.append(SiteSample(k[0], k[1], k[2], str(key), int(str(n)), int(str(ns or 0))))
        if len(kept) > 2 * SITES_PER_OP:
            kept.sort(key=lambda s: (-s.sampled_ns, -s.samples, s.stack_key))
            del kept[SITES_PER_OP:]
    for kept in by_op.values():
        kept.sort(key=lambda s: (-s.sampled_ns, -s.samples, s.stack_key))
        del kept[SITES_PER_OP:]


def read_in_flight(
    db: sqlite_utils.Database, end: float, window_s: float, job_id: str | None
) -> tuple[list[InFlight], list[RankState]]:
    """Each rank's newest ``nccl_comms`` row of ``(end - window_s, end]``, and per rank
    in flight there the ``nccl_calls`` rows not returned from its oldest collective in
    flight on, with their stacks (``hung.hung_findings``). Empty before node DB v3."""
    found = nccl.in_flight(db, end - window_s, end, job_id, MAX_RANK_STATES, MAX_HUNG)
    if found is None:
        return [], []
    keyed, ranks = found
    states, calls = [], []
    for (pid, rank, comm, comm_rank, nranks, ts, entered, _), rows in ranks:
        state = RankState(int(pid), None if rank is None else int(rank), str(comm),
                          int(comm_rank), int(nranks), float(ts), int(entered))  # fmt: skip
        states.append(state)
        calls += [InFlight(state, int(seq), str(op), float(enter), None if key is None
                           else str(key)) for seq, op, enter, key in rows]  # fmt: skip
    found_stacks = (
        stacks.read_stacks(db, {c.stack_key for c in calls if c.stack_key}) if keyed else {}
    )
    calls = [replace(c, stack=found_stacks.get(c.stack_key or "")) for c in calls]
    return calls, states
