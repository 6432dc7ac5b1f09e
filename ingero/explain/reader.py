"""Read one window of the node DB into plain values for the analysis (read-only connection).

A window holds the rows whose ``ts_end`` lies in ``(end - window, end]``, as in
``ingero.nodedb.window``; GPU busy fractions come from that module's ``read_window`` so
``explain`` and ``fleet-push`` measure the GPU the same way.
"""

from __future__ import annotations

import json
import sqlite3
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
from ingero.nodedb.schema import ANNOTATE_SOURCE, SCHEMA_VERSION, SchemaError, connect
from ingero.nodedb.schema import version as schema_version
from ingero.nodedb.window import NodeDbUnavailable, read_window
from ingero.runtime.errors import EXIT_DATAERR, IngeroError, UnavailableError
from ingero.schema.stacks import Stack, StackError, loads

DEFAULT_DB = Path(nodedb.DEFAULT_PATH)
# NCCL calls that are not one collective of a communicator (no alignment across ranks).
NON_COLLECTIVE_OPS = ("ncclGroupEnd", "ncclCommInitRank", "ncclCommDestroy")
NODE_TABLES = (
    "intervals",
    "raw_events",
    "host_intervals",
    "gpu_intervals",
    "gpu_processes",
    "processes",
)
# Node DB v3: NCCL collectives per communicator (ingero trace). Older node DBs lack them:
# merge, export and the fan-out carry them where a node DB has them (``OPTIONAL_TABLES``).
NCCL_TABLES = ("nccl_calls", "nccl_comms")
# Node DB v4: one row per distinct call stack; raw_events/nccl_calls.stack_key refer to it.
STACK_TABLES = ("stacks",)
# Node DB v5: what the job marked through ``ingero annotate`` (steps, phases, labels).
MARK_TABLES = ("marks",)
# Node DB v6: per (pid, CUDA stream) syncs, launches and sync-to-sync steps.
STREAM_TABLES = ("stream_intervals",)
QUERY_TABLES = (*NODE_TABLES, *NCCL_TABLES, *STACK_TABLES, *MARK_TABLES, *STREAM_TABLES)
# The tables merge/export/fan-out carry: every node DB has NODE_TABLES; the others only
# from the schema version that added them, so a DB without one gives no rows of it.
CARRIED_TABLES = QUERY_TABLES
OPTIONAL_TABLES = frozenset((*NCCL_TABLES, *STACK_TABLES, *MARK_TABLES, *STREAM_TABLES))
# The nccl_calls columns a collective is read from (``numbered_collective``).
NCCL_CALL_COLUMNS = ("ts_enter", "ts_return", "pid", "comm_rank", "rank", "op", "comm_hash", "seq")
# The column each table's rows are placed in time by (query --since, merge, export).
TIME_COLUMNS = {
    "intervals": "ts_end",
    "raw_events": "ts",
    "host_intervals": "ts_end",
    "gpu_intervals": "ts_end",
    "gpu_processes": "ts_end",
    "processes": "last_seen",
    "nccl_calls": "ts_enter",
    "nccl_comms": "ts",
    "stacks": "last_seen",
    "marks": "ts_start",
    "stream_intervals": "ts_end",
}


class NodeDbError(IngeroError):
    """The file is not a node DB this ingero can read."""

    exit_code = EXIT_DATAERR


def open_node_db(path: Path, timeout: float = 5.0) -> sqlite_utils.Database:
    """A read-only connection to a node DB, or a one-line error naming the path and the fix."""
    if not path.exists():
        raise UnavailableError(
            f"{path}: no node DB here; record one with `ingero trace --record`"
            " or point --db at an existing one"
        )
    if path.is_dir():
        raise NodeDbError(f"{path}: is a directory, not a node DB")
    try:
        db = connect(path, readonly=True, timeout=timeout)
    except SchemaError as exc:
        raise NodeDbError(f"{exc}: written by a newer ingero; upgrade ingero here") from None
    except sqlite3.Error as exc:
        raise NodeDbError(f"{path}: not a readable SQLite node DB ({exc})") from None
    found = schema_version(db)
    if found < 1:
        # Older versions are read as they are (a v1 DB lacks only the GPU health columns).
        db.conn.close()
        raise NodeDbError(
            f"{path}: not a node DB (schema version {found}, expected 1 to {SCHEMA_VERSION})"
        )
    return db


def latest_ts(db: sqlite_utils.Database) -> float | None:
    """The newest ``ts_end`` recorded in any interval table."""
    row = db.execute(
        "SELECT MAX(t) FROM (SELECT MAX(ts_end) AS t FROM intervals"
        " UNION ALL SELECT MAX(ts_end) FROM host_intervals"
        " UNION ALL SELECT MAX(ts_end) FROM gpu_intervals)"
    ).fetchone()
    return None if row[0] is None else float(row[0])


def read_window_data(
    db: sqlite_utils.Database, path: Path, end: float, window_s: float, job_id: str | None
) -> WindowData:
    """Everything the analysis needs about ``(end - window_s, end]``; ``job_id`` filters calls."""
    start = end - window_s
    job_sql, job_args = ("AND job_id = ?", (job_id,)) if job_id else ("", ())
    conn = db.conn
    # The time measured is the tracer's: the job's marked-step rows (``ingero annotate``)
    # are written on that server's own flush.
    first, last, pids = conn.execute(
        f"SELECT MIN(ts_start), MAX(ts_end), COUNT(DISTINCT pid) FROM intervals"
        f" WHERE ts_end > ? AND ts_end <= ? AND source != ? {job_sql}",
        (start, end, ANNOTATE_SOURCE, *job_args),
    ).fetchone()
    covered = max(0.0, float(last) - float(first)) if first is not None else 0.0
    # Per-interval percentiles cannot be merged exactly; a count-weighted mean is close for
    # steady intervals and keeps one slow interval visible.
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
        for src, op, count, total, p50, p95, p99, errors in conn.execute(
            f"SELECT source, op, SUM(count), SUM(total_ns),"
            f" SUM(p50_ns * count) * 1.0 / NULLIF(SUM(count), 0),"
            f" SUM(p95_ns * count) * 1.0 / NULLIF(SUM(count), 0),"
            f" SUM(p99_ns * count) * 1.0 / NULLIF(SUM(count), 0), SUM(errors)"
            f" FROM intervals WHERE ts_end > ? AND ts_end <= ? {job_sql}"
            f" GROUP BY source, op",
            (start, end, *job_args),
        )
    )
    host_row = conn.execute(
        "SELECT COUNT(*), MIN(ts_start), MAX(ts_end), SUM(offcpu_ns), SUM(page_allocs),"
        " SUM(block_io_count), MAX(block_io_p99_ns), SUM(tcp_retransmits), SUM(dropped_events)"
        " FROM host_intervals WHERE ts_end > ? AND ts_end <= ?",
        (start, end),
    ).fetchone()
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
    if "marks" not in db.table_names():
        return []
    job_sql, job_args = ("AND job_id = ?", (job_id,)) if job_id else ("", ())
    rows = db.execute(
        "SELECT name, pid, rank, ts_start, ts_end FROM marks WHERE kind = 'phase'"
        f" AND ts_start <= ? AND (ts_end IS NULL OR ts_end > ?) {job_sql}"
        " ORDER BY ts_start DESC LIMIT ?",
        (end, start, *job_args, MAX_PHASES),
    ).fetchall()
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
    job_sql, job_args = ("WHERE job_id = ?", (job_id,)) if job_id else ("", ())
    rows = db.execute(
        f"SELECT pid, comm, job_id, rank, last_seen FROM processes {job_sql}"
        " ORDER BY last_seen DESC, pid LIMIT 50",
        job_args,
    ).fetchall()
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


# gpu_intervals columns of node DB schema 2 (NVML): read only where present, so a version-1
# DB still explains. ``throttle_reasons`` is NVML's clocks-event bitmask; only its hardware
# slowdown reasons (``DEGRADING_THROTTLE``: thermal, power brake, the slowdown line) are
# throttling, as in fleet-push's GPU health: a GPU-bound job meets the software power cap on
# healthy GPUs every day. ``xids`` is the JSON list of the interval's critical XID numbers.
_THROTTLE_COLUMNS = ("throttle_reasons",)
_XID_COLUMNS = ("xids",)


def _gpu_extra_columns(conn: sqlite3.Connection) -> tuple[list[str], list[str]]:
    names = {str(row[1]) for row in conn.execute("PRAGMA table_info(gpu_intervals)")}
    return [n for n in _THROTTLE_COLUMNS if n in names], [n for n in _XID_COLUMNS if n in names]


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
    job_sql, job_args = ("AND job_id = ?", (job_id,)) if job_id else ("", ())
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
        for a, b, pid, src, op, n, tot, p95, err, nbytes in conn.execute(
            "SELECT ts_start, ts_end, pid, source, op, count, total_ns, p95_ns, errors, bytes"
            f" FROM intervals WHERE ts_end > ? AND ts_end <= ? {job_sql} ORDER BY ts_end",
            (start, end, *job_args),
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
        for a, b, off, pages, n, p99, retx in conn.execute(
            "SELECT ts_start, ts_end, offcpu_ns, page_allocs, block_io_count, block_io_p99_ns,"
            " tcp_retransmits FROM host_intervals WHERE ts_end > ? AND ts_end <= ?"
            " ORDER BY ts_end",
            (start, end),
        )
    )
    throttle_cols, xid_cols = _gpu_extra_columns(conn)
    extra = "".join(f', "{c}"' for c in (*throttle_cols, *xid_cols))
    gpus = []
    for row in conn.execute(
        f"SELECT ts_start, ts_end, gpu, busy_ns{extra} FROM gpu_intervals"
        " WHERE ts_end > ? AND ts_end <= ? ORDER BY ts_end",
        (start, end),
    ):
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
    for ts, dur, pid, rank, op, detail in conn.execute(
        "SELECT ts, duration_ns, pid, rank, op, detail FROM raw_events"
        f" WHERE source = 'nccl' AND ts > ? AND ts <= ? {job_sql} ORDER BY ts",
        (start, end, *job_args),
    ):
        call = collective(ts, dur, pid, rank, op, detail)
        if call is not None:
            raw.append(call)
    numbered = []
    if "nccl_calls" in db.table_names():  # node DB v3
        cols = ", ".join(NCCL_CALL_COLUMNS)
        for row in conn.execute(
            f"SELECT {cols} FROM nccl_calls WHERE ts_enter > ? AND ts_enter <= ? {job_sql}"
            " ORDER BY ts_enter",
            (start, end, *job_args),
        ):
            call = numbered_collective(dict(zip(NCCL_CALL_COLUMNS, row, strict=True)))
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


# Distinct stacks kept per (source, op, pid) when reading call sites: the rest still count
# in their op's sampled total, so the kept ones' estimates do not move; memory stays bounded
# whatever the number of distinct stacks.
SITES_PER_OP = 50
# Sampled calls read for call sites: the window's newest. Shares are estimated from them;
# the bound keeps explain's time flat however many calls a window holds.
SITE_ROWS = 200_000
_KEYS_PER_QUERY = 500  # SQLite's bound on host parameters is 32766 (999 before 3.32)


def has_stacks(db: sqlite_utils.Database) -> bool:
    """Node DB v4 (or a merged DB of one): a ``stacks`` table and ``raw_events.stack_key``."""
    names = {str(r[1]) for r in db.conn.execute("PRAGMA table_info(raw_events)")}
    return "stack_key" in names and "stacks" in db.table_names()


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
    if not has_stacks(db):
        return SiteData()
    start = end - window_s
    job_sql, job_args = ("AND job_id = ?", (job_id,)) if job_id else ("", ())
    conn = db.conn
    by_op: dict[tuple[str, str, int], list[SiteSample]] = {}
    sampled: dict[tuple[str, str, int], list[int]] = {}
    rows = conn.execute(
        "SELECT source, op, pid, stack_key, COUNT(*), SUM(COALESCE(duration_ns, 0)) FROM"
        " (SELECT source, op, pid, stack_key, duration_ns FROM raw_events"
        f" WHERE ts > ? AND ts <= ? {job_sql} ORDER BY ts DESC LIMIT ?)"
        " GROUP BY source, op, pid, stack_key",
        (start, end, *job_args, SITE_ROWS),
    )
    _collect(rows, by_op, sampled)
    stacked_nccl = {k[1:] for k, v in by_op.items() if k[0] == "nccl" and v}
    if "stack_key" in {str(r[1]) for r in conn.execute("PRAGMA table_info(nccl_calls)")}:
        rows = conn.execute(
            "SELECT 'nccl', op, pid, stack_key, COUNT(*),"
            " SUM(CAST(COALESCE(ts_return - ts_enter, 0) * 1e9 AS INTEGER)) FROM"
            " (SELECT op, pid, stack_key, ts_enter, ts_return FROM nccl_calls"
            f" WHERE ts_enter > ? AND ts_enter <= ? {job_sql} ORDER BY ts_enter DESC LIMIT ?)"
            " GROUP BY op, pid, stack_key",
            (start, end, *job_args, SITE_ROWS),
        )
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
        for src, op, pid, n, tot in conn.execute(
            "SELECT source, op, pid, SUM(count), SUM(total_ns) FROM intervals"
            f" WHERE ts_end > ? AND ts_end <= ? {job_sql} GROUP BY source, op, pid",
            (start, end, *job_args),
        )
    )
    return SiteData(
        samples=samples,
        sampled=tuple(
            SampledTotal(src, op, pid, n, ns) for (src, op, pid), (n, ns) in sampled.items()
        ),
        totals=totals,
        stacks=read_stacks(db, {s.stack_key for s in samples}),
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


def read_stacks(db: sqlite_utils.Database, keys: Iterable[str]) -> dict[str, Stack]:
    """The stacks of ``keys`` that the node DB holds and can decode (a damaged row is left
    out: its calls are counted without a site)."""
    out: dict[str, Stack] = {}
    columns, rows = stack_rows(db.conn, keys)
    for row in rows:
        r = dict(zip(columns, row, strict=True))
        try:
            out[str(r["stack_key"])] = loads(str(r["frames"]))
        except StackError:
            continue
    return out


def stack_rows(
    conn: sqlite3.Connection, keys: Iterable[str], node: str | None = None
) -> tuple[list[str], list[tuple[object, ...]]]:
    """The ``stacks`` rows of ``keys`` (of ``node`` in a merged DB), in bounded queries."""
    wanted = sorted(set(keys))
    columns: list[str] = []
    rows: list[tuple[object, ...]] = []
    for i in range(0, len(wanted), _KEYS_PER_QUERY):
        chunk: list[object] = list(wanted[i : i + _KEYS_PER_QUERY])
        where = f"stack_key IN ({', '.join('?' * len(chunk))})"
        if node is not None:
            where, chunk = f"node = ? AND {where}", [node, *chunk]
        cur = conn.execute(f"SELECT * FROM stacks WHERE {where}", chunk)
        columns = [d[0] for d in cur.description]
        rows += cur.fetchall()
    return columns, rows


# Ranks (process and communicator) read for hung collectives: the newest in the window.
MAX_RANK_STATES = 1000


def read_in_flight(
    db: sqlite_utils.Database, end: float, window_s: float, job_id: str | None
) -> tuple[list[InFlight], list[RankState]]:
    """Each rank's newest ``nccl_comms`` row of ``(end - window_s, end]``, and per rank
    in flight there the ``nccl_calls`` rows not returned from its oldest collective in
    flight on, with their stacks (``hung.hung_findings``). Empty before node DB v3."""
    if not {"nccl_calls", "nccl_comms"} <= set(db.table_names()):
        return [], []
    job_sql, job_args = ("AND job_id = ?", (job_id,)) if job_id else ("", ())
    conn = db.conn
    # SQLite takes the bare columns from the max(ts) row of each group.
    newest = conn.execute(
        "SELECT pid, rank, comm_hash, comm_rank, nranks, max(ts), entered_seq, inflight_seq"
        f" FROM nccl_comms WHERE ts > ? AND ts <= ? {job_sql} GROUP BY pid, comm_hash"
        " ORDER BY max(ts) DESC LIMIT ?",
        (end - window_s, end, *job_args, MAX_RANK_STATES),
    ).fetchall()
    states, calls = [], []
    keyed = "stack_key" in {str(r[1]) for r in conn.execute("PRAGMA table_info(nccl_calls)")}
    for pid, rank, comm, comm_rank, nranks, ts, entered, inflight in newest:
        state = RankState(int(pid), None if rank is None else int(rank), str(comm),
                          int(comm_rank), int(nranks), float(ts), int(entered))  # fmt: skip
        states.append(state)
        if inflight is None:
            continue
        rows = conn.execute(
            f"SELECT seq, op, ts_enter, {'stack_key' if keyed else 'NULL'} FROM nccl_calls"
            " WHERE comm_hash = ? AND seq >= ? AND seq <= ? AND pid = ? AND ts_return IS NULL"
            " AND ts_enter <= ? ORDER BY seq LIMIT ?",
            (comm, inflight, entered, pid, ts, MAX_HUNG),
        )
        calls += [InFlight(state, int(seq), str(op), float(enter), None if key is None
                           else str(key)) for seq, op, enter, key in rows]  # fmt: skip
    stacks = read_stacks(db, {c.stack_key for c in calls if c.stack_key}) if keyed else {}
    calls = [replace(c, stack=stacks.get(c.stack_key or "")) for c in calls]
    return calls, states
