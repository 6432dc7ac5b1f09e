"""Rows a traced training process would produce per interval, with noise and a slowdown knob.

Pure apart from its seeded random generator: ``tick`` takes the interval bounds and the
current slowdown and returns the rows; the runner writes them.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class WorkloadProfile:
    """A steady data-parallel training step loop on ``gpus`` GPUs."""

    launch_rate: float = 2000.0  # cudaLaunchKernel calls per second at full speed
    launches_per_step: int = 200
    gpus: int = 2
    gpu_busy: float = 0.85  # busy fraction of each GPU at full speed
    cpu_busy: float = 0.3  # host CPU busy fraction at full speed (rises with a slowdown)
    mem_available: float = 0.6  # host MemAvailable / MemTotal
    noise: float = 0.03  # relative standard deviation of every rate
    launch_call_ns: int = 6_000  # host time of one cudaLaunchKernel call
    pid: int = 4242
    job_id: str | None = None
    rank: int | None = None

    def validate(self) -> None:
        if not (self.launch_rate > 0 and math.isfinite(self.launch_rate)):
            raise ValueError("launch_rate must be a finite number > 0")
        if self.launches_per_step < 1 or self.gpus < 1:
            raise ValueError("launches_per_step and gpus must be >= 1")
        if not 0 < self.gpu_busy <= 1:
            raise ValueError("gpu_busy must be in (0, 1]")
        if not 0 <= self.noise < 0.5:
            raise ValueError("noise must be in [0, 0.5)")


@dataclass
class TickRows:
    intervals: list[dict[str, Any]] = field(default_factory=list)
    gpu_intervals: list[dict[str, Any]] = field(default_factory=list)
    host_intervals: list[dict[str, Any]] = field(default_factory=list)
    cpu_busy: float = 0.0  # for the synthetic /proc/stat
    mem_available: float = 1.0  # for the synthetic /proc/meminfo


class WorkloadGenerator:
    """Produces one interval's rows; ``slowdown`` 0.3 means 30% less work per second."""

    def __init__(self, profile: WorkloadProfile, seed: int | None = None) -> None:
        profile.validate()
        self.profile = profile
        self.rng = random.Random(seed)
        self._step_carry = 0.0

    def _jitter(self) -> float:
        # Clipped so a rare draw never makes a rate negative.
        return max(0.5, self.rng.gauss(1.0, self.profile.noise))

    def tick(self, ts_start: float, ts_end: float, slowdown: float = 0.0) -> TickRows:
        if ts_end <= ts_start:
            raise ValueError("an interval must end after it starts")
        if not 0 <= slowdown < 1:
            raise ValueError(f"slowdown must be in [0, 1), got {slowdown!r}")
        p = self.profile
        dt = ts_end - ts_start
        speed = 1.0 - slowdown
        launches = max(0, round(p.launch_rate * dt * speed * self._jitter()))
        steps_exact = launches / p.launches_per_step + self._step_carry
        steps = int(steps_exact)
        self._step_carry = steps_exact - steps
        tags = {"pid": p.pid, "job_id": p.job_id, "rank": p.rank}

        def interval(source: str, op: str, count: int, each_ns: float) -> dict[str, Any]:
            p50 = max(1, int(each_ns))
            return {
                "ts_start": ts_start,
                "ts_end": ts_end,
                **tags,
                "source": source,
                "op": op,
                "count": count,
                "total_ns": int(count * each_ns),
                "p50_ns": p50,
                "p95_ns": int(p50 * 1.8),
                "p99_ns": int(p50 * 3.0),
                "errors": 0,
                "bytes": 0,
            }

        # The slowdown is modelled as host contention: the GPUs wait, the CPUs get busier.
        rows = TickRows(
            cpu_busy=min(1.0, (p.cpu_busy + 0.5 * slowdown) * self._jitter()),
            mem_available=min(1.0, p.mem_available * self._jitter()),
        )
        rows.intervals.append(
            interval(
                "cuda_runtime", "cudaLaunchKernel", launches, p.launch_call_ns * self._jitter()
            )
        )
        busy_fractions = [min(1.0, p.gpu_busy * speed * self._jitter()) for _ in range(p.gpus)]
        if steps:
            # The host waits for the GPU once per step: that wait is most of the GPU busy time.
            sync_ns = 0.7 * dt * 1e9 * (sum(busy_fractions) / p.gpus) / steps
            rows.intervals.append(interval("cuda_runtime", "cudaStreamSynchronize", steps, sync_ns))
            rows.intervals.append(interval("synthetic", "step", steps, dt * 1e9 / steps))
        for gpu, busy in enumerate(busy_fractions):
            rows.gpu_intervals.append(
                {
                    "ts_start": ts_start,
                    "ts_end": ts_end,
                    "gpu": gpu,
                    "busy_ns": int(busy * dt * 1e9),
                    "mem_free_bytes": 20 * 2**30,
                    "mem_total_bytes": 80 * 2**30,
                }
            )
        rows.host_intervals.append(
            {
                "ts_start": ts_start,
                "ts_end": ts_end,
                "offcpu_ns": int(dt * 1e9 * (0.05 + slowdown) * self._jitter()),
                "page_allocs": int(500 * dt * self._jitter()),
                "block_io_count": int(20 * dt * self._jitter()),
                "block_io_p99_ns": 400_000,
                "tcp_retransmits": 0,
                "dropped_events": 0,
            }
        )
        return rows
