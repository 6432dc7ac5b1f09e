"""Windowed aggregates from the node DB written by ``ingero trace`` (read-only connection).

A window holds the rows whose ``ts_end`` lies in ``(end - window, end]``. Rates divide by the
time those rows cover (latest ``ts_end`` - earliest ``ts_start``), not by the window length,
so a flush boundary falling just inside or outside the window does not look like a slowdown
(rows are counted whole).

Only what was measured is reported: GPU busy comes from ``gpu_intervals`` (NVML or
nvidia-smi) or is None. The time the host waited in synchronize calls is kept apart as
``sync_busy_estimate``, a lower bound that ``explain`` may show as an estimate and that the
score never uses (on a training loop that rarely synchronises it reads near 0 on a busy GPU).

``read_window`` fetches the window's rows; ``aggregate_window`` (pure) turns rows into the
aggregates, so the benchmark and the tests interpret rows exactly as fleet-push does.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ingero.collectors.nvml import DEGRADING_THROTTLE
from ingero.nodedb.schema import SchemaError, connect
from ingero.nodedb.schema import version as schema_version

# Kernel launches through the runtime and through the driver API (PyTorch built against
# CUDA 13 launches through cuLaunchKernel only). A driver call the runtime makes inside a
# runtime call is not recorded (the runtime call is), so a runtime launch that calls the
# driver is counted once.
LAUNCH_OPS: Final = (
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cuLaunchCooperativeKernel",
)
SYNC_OPS: Final = (
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cuCtxSynchronize",
    "cuStreamSynchronize",
)
# One row per training step boundary, written by a framework hook or a synthetic workload.
STEP_OPS: Final = ("step",)
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
    # Processes whose kernel launches the window holds (the rows' pid, where recorded): the
    # traced processes whose liveness tells a stalled job from an ended one.
    launch_pids: tuple[int, ...] = ()

    @property
    def kernel_launch_rate(self) -> float | None:
        """Launches per second; None when the window holds no interval rows (unknown)."""
        return self.kernel_launches / self.covered_s if self.covered_s > 0 else None

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
    def gpu_mem_free_fraction(self) -> float | None:
        """Free share of the memory of the GPUs that reported free and total, or None."""
        pairs = [
            (g.mem_free_bytes, g.mem_total_bytes)
            for g in self.gpus.values()
            if g.mem_free_bytes is not None and g.mem_total_bytes
        ]
        if not pairs:
            return None
        free = sum(f for f, _ in pairs if f is not None)
        total = sum(t for _, t in pairs if t is not None)
        return min(1.0, max(0.0, free / total))

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
) -> WindowAggregates:
    """The aggregates of ``(start, end]`` from its rows (pure).

    ``gpu_rows`` may include rows ending at or before ``start``: the last of those per GPU
    is where the growth of its cumulative counters is counted from.
    """
    first: float | None = None
    last: float | None = None
    launches = steps = 0
    sync_ns: int | None = None
    launch_pids: set[int] = set()
    for row in intervals:
        ts_end = float(row["ts_end"])
        if not start < ts_end <= end:
            continue
        ts_start = float(row["ts_start"])
        first = ts_start if first is None else min(first, ts_start)
        last = ts_end if last is None else max(last, ts_end)
        op = row["op"]
        if op in LAUNCH_OPS:
            launches += int(row["count"])
            if row.get("pid") is not None:
                launch_pids.add(int(row["pid"]))
        elif op in STEP_OPS:
            steps += int(row["count"])
        elif op in SYNC_OPS:
            sync_ns = (sync_ns or 0) + int(row["total_ns"] or 0)
    covered = max(0.0, last - first) if first is not None and last is not None else 0.0

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
    )


def _rows(cursor: sqlite3.Cursor) -> list[dict[str, Any]]:
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor]


def read_window(
    path: Path, end: float, window_s: float, timeout_s: float = 0.5
) -> WindowAggregates:
    """Aggregate ``(end - window_s, end]``; raises NodeDbUnavailable with the reason."""
    if window_s <= 0:
        raise ValueError("window_s must be > 0")
    if not path.exists():
        raise NodeDbUnavailable(f"{path}: node DB does not exist")
    start = end - window_s
    try:
        db = connect(path, readonly=True, timeout=timeout_s)
    except SchemaError as exc:
        raise NodeDbUnavailable(str(exc)) from None
    except sqlite3.Error as exc:
        raise NodeDbUnavailable(f"{path}: {exc}") from None
    try:
        conn = db.conn
        intervals = _rows(
            conn.execute(
                "SELECT ts_start, ts_end, op, count, total_ns, pid FROM intervals"
                " WHERE ts_end > ? AND ts_end <= ?",
                (start, end),
            )
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
        if schema_version(db) >= 2:
            processes = _rows(
                conn.execute(
                    "SELECT ts_end, gpu, pid FROM gpu_processes WHERE ts_end > ? AND ts_end <= ?",
                    (start, end),
                )
            )
    except sqlite3.Error as exc:
        raise NodeDbUnavailable(f"{path}: {exc}") from None
    finally:
        db.conn.close()
    return aggregate_window(start, end, intervals, gpu_rows, processes)
