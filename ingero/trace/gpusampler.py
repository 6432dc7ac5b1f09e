"""GPU rows for the node DB (``gpu_intervals``, ``gpu_processes``), once per interval.

NVML first; where NVML cannot be used, nvidia-smi (utilization and memory only, at most every
``smi_period_s``: it is a process start per query); where neither answers, no rows and the
reason. ``ingero trace`` calls this every tracer interval and ``ingero gpu-sample`` where the
tracer does not run; the synthetic workload writes its rows through ``reading_rows`` too, so
they have exactly the shape the real sampler writes.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass, field
from typing import Any

from ingero.collectors.gpu import GpuQuery, GpuStatus, NvidiaSmi
from ingero.collectors.nvml import NvmlReader, NvmlReading
from ingero.runtime.clock import Clock, SystemClock
from ingero.trace.tags import TagCache

log = logging.getLogger(__name__)


@dataclass
class GpuRows:
    intervals: list[dict[str, Any]] = field(default_factory=list)
    processes: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None  # why there are no rows (or fewer than GPUs)


def _flag(value: bool | None) -> int | None:
    return None if value is None else int(value)


def reading_rows(
    reading: NvmlReading, ts_start: float, ts_end: float, source: str = "nvml"
) -> GpuRows:
    """The rows one NVML reading gives for the interval ``(ts_start, ts_end]``."""
    out = GpuRows(error=reading.error)
    span_ns = max(0.0, ts_end - ts_start) * 1e9
    for g in reading.gpus:
        out.intervals.append(
            {
                "ts_start": ts_start,
                "ts_end": ts_end,
                "gpu": g.index,
                "source": source,
                # NVML's utilization is the share of its last sample period (1/6 s to 1 s)
                # in which a kernel ran; spread over the interval as busy time.
                "busy_ns": None if g.utilization is None else int(g.utilization * span_ns),
                "mem_free_bytes": g.mem_free_bytes,
                "mem_total_bytes": g.mem_total_bytes,
                "mem_used_bytes": g.mem_used_bytes,
                "sm_clock_mhz": g.sm_clock_mhz,
                "sm_clock_max_mhz": g.sm_clock_max_mhz,
                "throttle_reasons": g.throttle_reasons,
                "temperature_c": g.temperature_c,
                "power_w": g.power_w,
                "ecc_corrected": g.ecc_corrected,
                "ecc_uncorrected": g.ecc_uncorrected,
                "retired_pages": g.retired_pages,
                "retired_pages_pending": _flag(g.retired_pages_pending),
                "remapped_rows_correctable": g.remapped_rows_correctable,
                "remapped_rows_uncorrectable": g.remapped_rows_uncorrectable,
                "remap_pending": _flag(g.remap_pending),
                "remap_failure": _flag(g.remap_failure),
                "xid_count": None if g.xids is None else len(g.xids),
                "xids": None if not g.xids else json.dumps(list(g.xids)),
                "lost": int(g.lost),
            }
        )
        for p in g.processes or ():
            out.processes.append(
                {
                    "ts_end": ts_end,
                    "gpu": g.index,
                    "pid": p.pid,
                    "used_memory_bytes": p.used_memory_bytes,
                    "job_id": p.job_id,
                    "rank": p.rank,
                }
            )
    return out


def smi_rows(status: GpuStatus, ts_start: float, ts_end: float) -> GpuRows:
    """The rows one nvidia-smi query gives: utilization and memory, nothing of health."""
    out = GpuRows(error=status.error)
    span_ns = max(0.0, ts_end - ts_start) * 1e9
    mib = 1024 * 1024
    for g in status.gpus:
        free = None if g.mem_free_mib is None else int(g.mem_free_mib * mib)
        total = None if g.mem_total_mib is None else int(g.mem_total_mib * mib)
        util = g.utilization_percent
        out.intervals.append(
            {
                "ts_start": ts_start,
                "ts_end": ts_end,
                "gpu": g.index,
                "source": "nvidia-smi",
                "busy_ns": None if util is None else int(min(100.0, util) / 100.0 * span_ns),
                "mem_free_bytes": free,
                "mem_total_bytes": total,
                "mem_used_bytes": None if free is None or total is None else total - free,
            }
        )
    return out


class GpuSampler:
    """What the node DB writers call once per interval; never raises for a GPU problem."""

    def __init__(
        self,
        nvml: NvmlReader | None,
        smi: GpuQuery | None,
        *,
        clock: Clock | None = None,
        smi_period_s: float = 5.0,
        tags: TagCache | None = None,
    ) -> None:
        self.clock = clock or SystemClock()
        self._tags = tags or TagCache()
        self.nvml = nvml
        self.smi = smi
        self.smi_period_s = smi_period_s
        self._smi_last: float | None = None
        self._known_pids: set[int] = set()
        self._missing: dict[int, dict[str, str]] = {}
        if nvml is not None:
            nvml.set_job_of(self._job_of)

    def _job_of(self, pid: int) -> tuple[str | None, int | None]:
        tags = self._tags.get(pid)
        return tags.job_id, tags.rank

    def sample(self, ts_start: float, ts_end: float) -> GpuRows:
        """Rows for ``(ts_start, ts_end]``: NVML's, else nvidia-smi's when due, else none."""
        nvml_error = None
        if self.nvml is not None:
            reading = self.nvml.read()
            if reading.error is None:
                self._forget_gone(reading)
                self._log_missing(reading)
                return reading_rows(reading, ts_start, ts_end)
            nvml_error = reading.error
        if self.smi is None:
            return GpuRows(error=nvml_error or "no GPU source")
        # nvidia-smi is a process start per query: at most one per smi_period_s, and its row
        # then covers the time since the previous one.
        now = self.clock.monotonic()
        if self._smi_last is not None and now - self._smi_last < self.smi_period_s:
            return GpuRows()
        start = ts_start if self._smi_last is None else ts_end - (now - self._smi_last)
        self._smi_last = now
        rows = smi_rows(self.smi.query(), start, ts_end)
        if rows.error is not None and nvml_error is not None:
            rows.error = f"{nvml_error}; {rows.error}"
        return rows

    def _log_missing(self, reading: NvmlReading) -> None:
        """Say once (and again when it changes) what a GPU does not report, and why."""
        missing = {g.index: dict(g.missing) for g in reading.gpus}
        if missing == self._missing:
            return
        self._missing = missing
        for index, fields in sorted(missing.items()):
            if fields:
                why = ", ".join(f"{name} ({reason})" for name, reason in sorted(fields.items()))
                log.warning("GPU %d: not measured: %s", index, why)

    def _forget_gone(self, reading: NvmlReading) -> None:
        """Drop the tags of processes no GPU lists any more, so the cache stays bounded."""
        pids = {p.pid for g in reading.gpus for p in g.processes or ()}
        for pid in self._known_pids - pids:
            self._tags.forget(pid)
        self._known_pids = pids

    def close(self) -> None:
        if self.nvml is not None:
            self.nvml.close()


def default_sampler(clock: Clock | None = None) -> GpuSampler:
    """NVML, with nvidia-smi as the fallback where it is installed."""
    smi = NvidiaSmi() if shutil.which("nvidia-smi") else None
    return GpuSampler(NvmlReader(clock=clock), smi, clock=clock)
