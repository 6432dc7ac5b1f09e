"""Windowed aggregates from the node DB written by ``ingero trace`` (read-only connection).

A window holds the rows whose ``ts_end`` lies in ``(end - window, end]``. Rates divide by the
time those rows cover (latest ``ts_end`` - earliest ``ts_start``), not by the window length,
so a flush boundary falling just inside or outside the window does not look like a slowdown
(rows are counted whole).

Only what was measured is reported: GPU busy comes from ``gpu_intervals`` (NVML or
nvidia-smi) or is None. The time the host waited in synchronize calls is kept apart as
``sync_busy_estimate``, a lower bound that ``explain`` may show as an estimate and that the
score never uses (on a training loop that rarely synchronises it reads near 0 on a busy GPU).

``read_window`` fetches the rows of a window given by the caller (``ingero explain``'s time
ranges). fleet-push reads with ``read_latest`` instead: its window ends at the newest tracer
interval written, not at the time of the push, so a tracer that writes a few ms late makes a
push find nothing new ("no data", ``new_intervals`` 0), never a window short of rows; and it
starts no later than where the previous push's window ended, so no row is skipped. A tracer
interval is one ``host_intervals`` row (the tracer writes one every interval, whatever it
traced), or the interval rows sharing one ``ts_end`` where no host row was written.
``aggregate_window`` (pure) turns rows into the aggregates and ``window_start`` (pure) places
the window, so the benchmark and the tests interpret rows exactly as fleet-push does.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import sqlite_utils

from ingero.collectors.nvml import DEGRADING_THROTTLE
from ingero.nodedb.ops import LAUNCH_OPS, STEP_OPS, SYNC_OPS, WORK_OPS
from ingero.nodedb.schema import ANNOTATE_SOURCE, SchemaError, connect

# A push that comes after a long gap (a slow Fleet, a suspended agent) reads at most this
# many push windows back: its read stays bounded, and rows older than that are history.
LOOKBACK_WINDOWS: Final = 4
# Cumulative GPU counters whose growth within a window is reported.
COUNTERS: Final = (
    "ecc_uncorrected",
    "ecc_corrected",
    "retired_pages",
    "remapped_rows_uncorrectable",
)


class NodeDbUnavailable(Exception):
    """The node DB is missing, locked, corrupt or from a newer ingero; the agent goes stale."""


@dataclass(frozen=True)
class GpuWindow:
    """One GPU over a window. None: not measured in the window (never a stand-in 0)."""

    gpu: int
    busy: float | None = None  # busy fraction over the time of the rows that measured it
    source: str | None = None  # nvml | nvidia-smi (None: a version-1 row)
    mem_free_bytes: int | None = None  # the least free in the window
    mem_total_bytes: int | None = None
    mem_used_bytes: int | None = None  # the most used
    sm_clock_mhz: float | None = None  # mean
    sm_clock_max_mhz: int | None = None
    throttle_rows: int = 0  # rows that reported clock event reasons
    throttled_rows: int = 0  # ... with a reason that is a hardware slowdown
    throttle_reasons: int = 0  # every reason seen (bitwise or)
    xid_watched: bool = False
    xids: tuple[tuple[float, int], ...] = ()  # (row ts_end, XID)
    counters: Mapping[str, int] = field(default_factory=dict)  # latest cumulative values
    new: Mapping[str, int] = field(default_factory=dict)  # growth within the window
    retired_pages_pending: bool | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    lost: bool = False
    pids: tuple[int, ...] = ()  # processes NVML listed on this GPU

    @property
    def throttled_fraction(self) -> float | None:
        return self.throttled_rows / self.throttle_rows if self.throttle_rows else None

    @property
    def health_measured(self) -> bool:
        """Whether anything in the window reported on this GPU's hardware health."""
        return (
            self.lost
            or self.throttle_rows > 0
            or self.xid_watched
            or bool(self.counters)
            or self.remap_pending is not None
            or self.retired_pages_pending is not None
        )


@dataclass(frozen=True)
class StreamWindow:
    """One (process, CUDA stream) over a window (node DB version 6, ``stream_intervals``)."""

    syncs: int = 0
    launches: int = 0
    steps: int = 0  # sync-to-sync gaps
    step_ns: int = 0
    hist: Mapping[int, int] = field(default_factory=dict)  # step times, log-linear slots


@dataclass(frozen=True)
class WindowAggregates:
    start: float
    end: float
    covered_s: float  # time the window's interval rows cover; 0 when there are none
    kernel_launches: int
    steps: int
    gpus: Mapping[int, GpuWindow] = field(default_factory=dict)
    # Host time in synchronize calls ÷ covered time: a lower bound of GPU busy, for explain
    # only (shown as an estimate; never a score input).
    sync_busy_estimate: float | None = None
    # Processes whose kernel or graph launches the window holds (the rows' pid, where
    # recorded): the traced processes whose liveness tells a stalled job from an ended one.
    launch_pids: tuple[int, ...] = ()
    # Tracer intervals the window covers, and of them those that end after the previous
    # window (``aggregate_window``'s ``after``): what is new in this window, with the kernel
    # and graph launches (the work) and the seconds of those new intervals. 0 new
    # intervals: no data.
    tracer_intervals: int = 0
    new_intervals: int = 0
    new_launches: int = 0
    new_covered_s: float = 0.0
    # The newest tracer interval end in the node DB (``read_latest``): how long the tracer
    # has been silent; None where nothing was ever written or not asked.
    latest_end: float | None = None
    graph_launches: int = 0  # CUDA graph replays (GRAPH_LAUNCH_OPS)
    # TCP retransmits the tracer counted node-wide in the window's host intervals (the
    # network cause class of a straggler: ingero.push.cause).
    tcp_retransmits: int = 0
    # Synchronize calls by pid (where recorded): an inference server's steps, one host
    # wait for the sampled tokens a forward step.
    syncs: Mapping[int, int] = field(default_factory=dict)
    # Per (pid, stream handle as 16 hex digits): the streams' syncs, launches and steps
    # (empty before node DB version 6, or where the tracer saw no stream named).
    streams: Mapping[tuple[int, str], StreamWindow] = field(default_factory=dict)

    @property
    def kernel_launch_rate(self) -> float | None:
        """Launches per second; None when the window holds no interval rows (unknown)."""
        return self.kernel_launches / self.covered_s if self.covered_s > 0 else None

    @property
    def graph_launch_rate(self) -> float | None:
        """Graph launches per second; None when the window holds none (a job that does not
        replay graphs has no such rate, not a rate of 0)."""
        if self.graph_launches == 0 or self.covered_s <= 0:
            return None
        return self.graph_launches / self.covered_s

    @property
    def step_rate(self) -> float | None:
        """Steps per second; None when nothing writes step rows (unknown, not 0)."""
        if self.steps == 0 or self.covered_s <= 0:
            return None
        return self.steps / self.covered_s

    @property
    def gpu_busy(self) -> dict[int, float]:
        """Measured busy fraction per GPU."""
        return {i: g.busy for i, g in self.gpus.items() if g.busy is not None}

    @property
    def busy_source(self) -> str | None:
        """``gpu_intervals`` when GPU busy was measured, else None."""
        return "gpu_intervals" if self.gpu_busy else None

    @property
    def gpu_busy_fraction(self) -> float | None:
        """Mean busy fraction over the GPUs that measured it, or None."""
        busy = self.gpu_busy
        return sum(busy.values()) / len(busy) if busy else None

    @property
    def gpu_pids(self) -> tuple[int, ...]:
        """Processes NVML listed on any GPU in the window."""
        return tuple(sorted({p for g in self.gpus.values() for p in g.pids}))


def _growth(first: int | None, last: int) -> int:
    """Increase of a cumulative counter; a counter that went down was reset (driver reload)."""
    if first is None:
        return 0
    return last - first if last >= first else last


def _gpu_window(
    gpu: int,
    rows: list[Mapping[str, Any]],
    before: Mapping[str, Any] | None,
    pids: Iterable[int],
) -> GpuWindow:
    busy_ns = 0.0
    busy_span = 0.0
    frees: list[int] = []
    totals: list[int] = []
    used: list[int] = []
    clocks: list[int] = []
    clock_max: int | None = None
    throttle_rows = throttled = reasons = 0
    xid_watched = False
    xids: list[tuple[float, int]] = []
    firsts: dict[str, int | None] = {}
    lasts: dict[str, int] = {}
    flags: dict[str, bool | None] = {
        "retired_pages_pending": None,
        "remap_pending": None,
        "remap_failure": None,
    }
    lost = False
    source = None
    for row in rows:
        span = float(row["ts_end"]) - float(row["ts_start"])
        source = row.get("source") or source
        if row.get("busy_ns") is not None and span > 0:
            busy_ns += float(row["busy_ns"])
            busy_span += span
        for column, out in (
            ("mem_free_bytes", frees),
            ("mem_total_bytes", totals),
            ("mem_used_bytes", used),
            ("sm_clock_mhz", clocks),
        ):
            if row.get(column) is not None:
                out.append(int(row[column]))
        if row.get("sm_clock_max_mhz") is not None:
            clock_max = int(row["sm_clock_max_mhz"])
        if row.get("throttle_reasons") is not None:
            mask = int(row["throttle_reasons"])
            throttle_rows += 1
            reasons |= mask
            throttled += bool(mask & DEGRADING_THROTTLE)
        if row.get("xid_count") is not None:
            xid_watched = True
            if row.get("xids"):
                try:
                    codes = json.loads(row["xids"])
                except ValueError:
                    codes = []
                xids += [(float(row["ts_end"]), int(c)) for c in codes if isinstance(c, int)]
        for name in COUNTERS:
            if row.get(name) is not None:
                value = int(row[name])
                if name not in firsts:
                    # Growth is counted from the last value before the window when there is one.
                    prior = before.get(name) if before is not None else None
                    firsts[name] = value if prior is None else int(prior)
                lasts[name] = value
        for name in flags:
            if row.get(name) is not None:
                flags[name] = bool(flags[name]) or bool(row[name])
        lost = lost or bool(row.get("lost"))
    return GpuWindow(
        gpu=gpu,
        busy=min(1.0, max(0.0, busy_ns / 1e9 / busy_span)) if busy_span > 0 else None,
        source=source,
        mem_free_bytes=min(frees) if frees else None,
        mem_total_bytes=max(totals) if totals else None,
        mem_used_bytes=max(used) if used else None,
        sm_clock_mhz=sum(clocks) / len(clocks) if clocks else None,
        sm_clock_max_mhz=clock_max,
        throttle_rows=throttle_rows,
        throttled_rows=throttled,
        throttle_reasons=reasons,
        xid_watched=xid_watched,
        xids=tuple(xids),
        counters=dict(lasts),
        new={name: _growth(firsts.get(name), last) for name, last in lasts.items()},
        retired_pages_pending=flags["retired_pages_pending"],
        remap_pending=flags["remap_pending"],
        remap_failure=flags["remap_failure"],
        lost=lost,
        pids=tuple(sorted(set(pids))),
    )


def aggregate_window(
    start: float,
    end: float,
    intervals: Iterable[Mapping[str, Any]],
    gpu_rows: Iterable[Mapping[str, Any]] = (),
    gpu_processes: Iterable[Mapping[str, Any]] = (),
    host_rows: Iterable[Mapping[str, Any]] = (),
    after: float | None = None,
    latest_end: float | None = None,
    stream_rows: Iterable[Mapping[str, Any]] = (),
    job_id: str | None = None,
) -> WindowAggregates:
    """The aggregates of ``(start, end]`` from its rows (pure).

    ``gpu_rows`` may include rows ending at or before ``start``: the last of those per GPU
    is where the growth of its cumulative counters is counted from. ``host_rows``: the
    tracer's ``host_intervals`` rows, one per tracer interval (they make a window without
    kernel or graph launches a measurement of none); ``after``: where the previous window ended
    (the intervals ending later are this window's new ones; None: all are new).
    ``stream_rows``: ``stream_intervals`` rows, summed per (pid, stream). ``job_id``: the job
    whose marked steps count (fleet-push's pushed job): another job's writer, or one outside
    any job, marks steps of its own, not this job's; None counts every writer's.
    """
    first: float | None = None
    last: float | None = None
    launches = graphs = steps = 0
    sync_ns: int | None = None
    syncs: dict[int, int] = {}
    launch_pids: set[int] = set()
    # Tracer intervals by their end: (start, kernel and graph launches).
    covered_by: dict[float, tuple[float, int]] = {}

    def cover(ts_start: float, ts_end: float, count: int) -> None:
        nonlocal first, last
        first = ts_start if first is None else min(first, ts_start)
        last = ts_end if last is None else max(last, ts_end)
        known = covered_by.get(ts_end)
        covered_by[ts_end] = (
            min(ts_start, known[0]) if known else ts_start,
            count + (known[1] if known else 0),
        )

    retransmits = 0
    for row in host_rows:
        ts_end = float(row["ts_end"])
        if start < ts_end <= end:
            cover(float(row["ts_start"]), ts_end, 0)
            retransmits += int(row.get("tcp_retransmits") or 0)
    for row in intervals:
        ts_end = float(row["ts_end"])
        if not start < ts_end <= end:
            continue
        op = row["op"]
        if row.get("source") == ANNOTATE_SOURCE:
            # The job's own step marks, written on the annotate server's flush: steps of the
            # window, not a tracer interval (the tracer's rows measure the time).
            if op in STEP_OPS and (job_id is None or row.get("job_id") == job_id):
                steps += int(row["count"])
            continue
        count = int(row["count"]) if op in WORK_OPS else 0
        cover(float(row["ts_start"]), ts_end, count)
        if op in WORK_OPS:
            if op in LAUNCH_OPS:
                launches += count
            else:
                graphs += count
            if row.get("pid") is not None:
                launch_pids.add(int(row["pid"]))
        elif op in STEP_OPS:
            steps += int(row["count"])
        elif op in SYNC_OPS:
            sync_ns = (sync_ns or 0) + int(row["total_ns"] or 0)
            if row.get("pid") is not None:
                pid = int(row["pid"])
                syncs[pid] = syncs.get(pid, 0) + int(row["count"])
    gpu_rows = list(gpu_rows)
    if not covered_by:
        # No tracer here (``ingero gpu-sample`` writes the node DB): its GPU rows, one set
        # per interval, are the intervals measured. Beside a tracer they are not counted,
        # so an NVML row written apart from the tracer's tick never adds an interval.
        for row in gpu_rows:
            ts_end = float(row["ts_end"])
            if start < ts_end <= end:
                cover(float(row["ts_start"]), ts_end, 0)
    covered = max(0.0, last - first) if first is not None and last is not None else 0.0
    new = [(ts_end, *v) for ts_end, v in covered_by.items() if after is None or ts_end > after]

    inside: dict[int, list[Mapping[str, Any]]] = {}
    before: dict[int, Mapping[str, Any]] = {}
    for row in sorted(gpu_rows, key=lambda r: float(r["ts_end"])):
        gpu = int(row["gpu"])
        if float(row["ts_end"]) <= start:
            before[gpu] = row
        elif float(row["ts_end"]) <= end:
            inside.setdefault(gpu, []).append(row)
    pids: dict[int, set[int]] = {}
    for proc in gpu_processes:
        if start < float(proc["ts_end"]) <= end:
            pids.setdefault(int(proc["gpu"]), set()).add(int(proc["pid"]))
    gpus = {
        gpu: _gpu_window(gpu, rows, before.get(gpu), pids.get(gpu, ()))
        for gpu, rows in sorted(inside.items())
    }
    return WindowAggregates(
        start=start,
        end=end,
        streams=_streams(start, end, stream_rows),
        covered_s=covered,
        kernel_launches=launches,
        steps=steps,
        gpus=gpus,
        sync_busy_estimate=(
            min(1.0, max(0.0, sync_ns / 1e9 / covered))
            if sync_ns is not None and covered > 0
            else None
        ),
        launch_pids=tuple(sorted(launch_pids)),
        syncs=syncs,
        tracer_intervals=len(covered_by),
        new_intervals=len(new),
        new_launches=sum(count for _, _, count in new),
        new_covered_s=sum(max(0.0, ts_end - ts_start) for ts_end, ts_start, _ in new),
        latest_end=latest_end,
        graph_launches=graphs,
        tcp_retransmits=retransmits,
    )


def _streams(
    start: float, end: float, rows: Iterable[Mapping[str, Any]]
) -> dict[tuple[int, str], StreamWindow]:
    """Stream rows of ``(start, end]`` summed per (pid, stream); a histogram that is not a
    JSON object of slot → count is left out (its counts stay)."""
    sums: dict[tuple[int, str], list[int]] = {}
    hists: dict[tuple[int, str], dict[int, int]] = {}
    for row in rows:
        if not start < float(row["ts_end"]) <= end:
            continue
        key = (int(row["pid"]), str(row["stream"]))
        acc = sums.setdefault(key, [0, 0, 0, 0])
        for i, col in enumerate(("syncs", "launches", "steps", "step_ns")):
            acc[i] += int(row.get(col) or 0)
        hist = hists.setdefault(key, {})
        try:
            found = json.loads(row.get("step_hist") or "{}")
        except ValueError:
            continue
        if isinstance(found, dict):
            for slot, count in found.items():
                # isdecimal, not isdigit: "²" is a digit int() refuses.
                ok = slot.isdecimal() and type(count) is int and count > 0
                if ok:
                    hist[int(slot)] = hist.get(int(slot), 0) + count
    return {
        k: StreamWindow(syncs=v[0], launches=v[1], steps=v[2], step_ns=v[3], hist=hists[k])
        for k, v in sums.items()
    }


def nothing_new(
    now: float, window_s: float, after: float | None, latest_end: float | None
) -> WindowAggregates:
    """The window of a read that found no tracer interval ending after ``after`` (pure)."""
    end = after if after is not None else now
    return WindowAggregates(
        start=end - window_s,
        end=end,
        covered_s=0.0,
        kernel_launches=0,
        steps=0,
        latest_end=latest_end,
    )


def window_start(latest_end: float, window_s: float, after: float | None) -> float:
    """Where fleet-push's window ending at the newest tracer interval starts (pure): one
    window back, or earlier down to where the previous window ended when the tracer wrote
    more since (a late push reads every row once), at most ``LOOKBACK_WINDOWS`` back."""
    start = latest_end - window_s
    if after is not None and after < start:
        start = max(after, latest_end - LOOKBACK_WINDOWS * window_s)
    return start


def _rows(cursor: sqlite3.Cursor) -> list[dict[str, Any]]:
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor]


def read_window(
    path: Path, end: float, window_s: float, timeout_s: float = 0.5
) -> WindowAggregates:
    """Aggregate ``(end - window_s, end]``; raises NodeDbUnavailable with the reason."""
    if window_s <= 0:
        raise ValueError("window_s must be > 0")
    with _open(path, timeout_s) as db:
        return _read(db, path, end - window_s, end, window_s)


def read_latest(
    path: Path,
    now: float,
    window_s: float,
    after: float | None,
    timeout_s: float = 0.5,
    job_id: str | None = None,
) -> WindowAggregates:
    """fleet-push's window: the one ending at the newest tracer interval written by ``now``
    (``window_start``), new where it ends after ``after``; a window with no new interval
    (``new_intervals`` 0) holds no rows; its marked steps only ``job_id``'s (where given).
    Raises NodeDbUnavailable with the reason."""
    if window_s <= 0:
        raise ValueError("window_s must be > 0")
    with _open(path, timeout_s) as db:
        try:
            latest = db.conn.execute(
                "SELECT MAX(m) FROM (SELECT MAX(ts_end) AS m FROM host_intervals"
                " WHERE ts_end <= ? UNION ALL SELECT MAX(ts_end) FROM intervals"
                " WHERE ts_end <= ? AND source != ?)",
                (now, now, ANNOTATE_SOURCE),
            ).fetchone()[0]
            if latest is None:  # no tracer: ``ingero gpu-sample``'s rows are the intervals
                latest = db.conn.execute(
                    "SELECT MAX(ts_end) FROM gpu_intervals WHERE ts_end <= ?", (now,)
                ).fetchone()[0]
        except sqlite3.Error as exc:
            raise NodeDbUnavailable(f"{path}: {exc}") from None
        if latest is None or (after is not None and float(latest) <= after):
            return nothing_new(now, window_s, after, None if latest is None else float(latest))
        latest = float(latest)
        start = window_start(latest, window_s, after)
        return _read(db, path, start, latest, window_s, after=after, host=True, job_id=job_id)


@contextmanager
def _open(path: Path, timeout_s: float) -> Iterator[sqlite_utils.Database]:
    if not path.exists():
        raise NodeDbUnavailable(f"{path}: node DB does not exist")
    try:
        db = connect(path, readonly=True, timeout=timeout_s)
    except SchemaError as exc:
        raise NodeDbUnavailable(str(exc)) from None
    except sqlite3.Error as exc:
        raise NodeDbUnavailable(f"{path}: {exc}") from None
    try:
        yield db
    finally:
        db.conn.close()


def _read(
    db: sqlite_utils.Database,
    path: Path,
    start: float,
    end: float,
    window_s: float,
    *,
    after: float | None = None,
    host: bool = False,
    job_id: str | None = None,
) -> WindowAggregates:
    conn = db.conn
    try:
        intervals = _rows(
            conn.execute(
                "SELECT ts_start, ts_end, op, count, total_ns, pid, source, job_id FROM intervals"
                " WHERE ts_end > ? AND ts_end <= ?",
                (start, end),
            )
        )
        host_rows = (
            _rows(
                conn.execute(
                    "SELECT ts_start, ts_end, tcp_retransmits FROM host_intervals"
                    " WHERE ts_end > ? AND ts_end <= ?",
                    (start, end),
                )
            )
            if host
            else []
        )
        # One window back as well: the last row before the window is where counter growth
        # is counted from.
        gpu_rows = _rows(
            conn.execute(
                "SELECT * FROM gpu_intervals WHERE ts_end > ? AND ts_end <= ?",
                (start - window_s, end),
            )
        )
        processes: list[dict[str, Any]] = []
        streams: list[dict[str, Any]] = []
        # By table, not by user_version: a merged DB (ingero merge) is at this schema's
        # version but holds only the tables its nodes had (v5 nodes: no stream_intervals).
        tables = set(db.table_names())
        if "stream_intervals" in tables:
            streams = _rows(
                conn.execute(
                    "SELECT ts_end, pid, stream, syncs, launches, steps, step_ns, step_hist"
                    " FROM stream_intervals WHERE ts_end > ? AND ts_end <= ?",
                    (start, end),
                )
            )
        if "gpu_processes" in tables:
            processes = _rows(
                conn.execute(
                    "SELECT ts_end, gpu, pid FROM gpu_processes WHERE ts_end > ? AND ts_end <= ?",
                    (start, end),
                )
            )
    except sqlite3.Error as exc:
        raise NodeDbUnavailable(f"{path}: {exc}") from None
    return aggregate_window(
        start,
        end,
        intervals,
        gpu_rows,
        processes,
        host_rows,
        after=after,
        latest_end=end if host else None,
        stream_rows=streams,
        job_id=job_id,
    )
