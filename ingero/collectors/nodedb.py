"""Windowed aggregates from the node DB written by ``ingero trace`` (read-only connection).

A window holds the rows whose ``ts_end`` lies in ``(end - window, end]``. Rates divide by the
time those rows cover (latest ``ts_end`` - earliest ``ts_start``), not by the window length,
so a flush boundary falling just inside or outside the window does not look like a slowdown
(rows are counted whole).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from ingero.nodedb.schema import SchemaError, connect

LAUNCH_OPS: Final = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC")
SYNC_OPS: Final = (
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cuCtxSynchronize",
    "cuStreamSynchronize",
)
# One row per training step boundary, written by a framework hook or the synthetic workload.
STEP_OPS: Final = ("step",)


class NodeDbUnavailable(Exception):
    """The node DB is missing, locked, corrupt or from a newer ingero; the agent goes stale."""


@dataclass(frozen=True)
class WindowAggregates:
    start: float
    end: float
    covered_s: float  # time the window's rows cover; 0 when the window has no rows
    kernel_launches: int
    steps: int
    busy_source: str | None  # "gpu_intervals", "sync" or None
    gpu_busy: dict[int, float] = field(default_factory=dict)  # GPU index -> busy fraction

    @property
    def kernel_launch_rate(self) -> float:
        return self.kernel_launches / self.covered_s if self.covered_s > 0 else 0.0

    @property
    def step_rate(self) -> float | None:
        if self.steps == 0 or self.covered_s <= 0:
            return None
        return self.steps / self.covered_s

    @property
    def gpu_busy_fraction(self) -> float | None:
        """Mean busy fraction over the GPUs seen, or None when nothing measured it."""
        if not self.gpu_busy:
            return None
        return sum(self.gpu_busy.values()) / len(self.gpu_busy)


def _placeholders(values: tuple[str, ...]) -> str:
    return ",".join("?" * len(values))


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
        span = conn.execute(
            "SELECT MIN(ts_start), MAX(ts_end) FROM intervals WHERE ts_end > ? AND ts_end <= ?",
            (start, end),
        ).fetchone()
        first, last = span
        covered = max(0.0, float(last) - float(first)) if first is not None else 0.0

        def op_count(ops: tuple[str, ...]) -> int:
            row = conn.execute(
                f"SELECT COALESCE(SUM(count), 0) FROM intervals "
                f"WHERE ts_end > ? AND ts_end <= ? AND op IN ({_placeholders(ops)})",
                (start, end, *ops),
            ).fetchone()
            return int(row[0])

        launches = op_count(LAUNCH_OPS)
        steps = op_count(STEP_OPS)

        busy: dict[int, float] = {}
        source: str | None = None
        for gpu, busy_ns, span_s in conn.execute(
            "SELECT gpu, SUM(busy_ns), SUM(ts_end - ts_start) FROM gpu_intervals "
            "WHERE ts_end > ? AND ts_end <= ? AND busy_ns IS NOT NULL GROUP BY gpu",
            (start, end),
        ):
            if span_s and span_s > 0:
                busy[int(gpu)] = min(1.0, max(0.0, float(busy_ns) / 1e9 / float(span_s)))
        if busy:
            source = "gpu_intervals"
        elif covered > 0:
            # Time the host waited in synchronize calls is time the GPU was busy: a lower bound.
            sync_ns = conn.execute(
                f"SELECT SUM(total_ns) FROM intervals "
                f"WHERE ts_end > ? AND ts_end <= ? AND op IN ({_placeholders(SYNC_OPS)})",
                (start, end, *SYNC_OPS),
            ).fetchone()[0]
            if sync_ns is not None:
                busy[0] = min(1.0, max(0.0, float(sync_ns) / 1e9 / covered))
                source = "sync"
    except sqlite3.Error as exc:
        raise NodeDbUnavailable(f"{path}: {exc}") from None
    finally:
        db.conn.close()
    return WindowAggregates(
        start=start,
        end=end,
        covered_s=covered,
        kernel_launches=launches,
        steps=steps,
        busy_source=source,
        gpu_busy=busy,
    )
