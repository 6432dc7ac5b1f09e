"""Rows a traced training process produces per interval on a real GPU node, with noise, a
slowdown knob and a stall.

The shapes imitate what ``ingero trace`` recorded of real PyTorch training loops on an H100
(PyTorch 2.11 built against CUDA 13; docs/benchmarks.md#what-ingero-recorded-on-a-real-h100):
kernels launched through the driver API (``cuda_driver``/``cuLaunchKernel``, never
``cudaLaunchKernel``), rare synchronisations, no step rows (nothing writes them on a real
node), per-process off-CPU rows, and one ``gpu_intervals`` row per GPU per interval exactly as
the NVML sampler writes it (through the same ``reading_rows``), with the process listed in
``gpu_processes``.

- ``cpu-bound`` (the reference's "mlp": 8 x Linear(512), batch 64, ~390 steps/s): ~19,500
  cuLaunchKernel/s of ~6.5 µs, one cudaDeviceSynchronize per 20 steps (~16/s, ~20 µs),
  ~600 context switches/s with ~2 s off-CPU per s over all threads, a few cuMemAlloc at start;
- ``gpu-bound`` (the reference's "gpt": 6-layer transformer, ~10 steps/s): ~3,480
  cuLaunchKernel/s of ~184 µs (the launch queue is full), ~1 cudaDeviceSynchronize/s of
  ~218 ms, ~189 cudaMemcpyAsync/s of ~119 µs, ~32 context switches/s;
- ``graphs``: the gpu-bound loop replaying CUDA graphs as torch.compile
  ``mode="reduce-overhead"`` does. What a real H200 recorded
  (docs/decisions/0026-graph-launches-count-as-work.md): replays through the runtime
  (``cuda_runtime``/``cudaGraphLaunch``, ~4.1 µs each), one ``cudaLaunchKernel`` per replay
  (~7.3 µs: the input copied into the graph's static buffer), no driver call and no
  cudaMemcpyAsync. Assumed: ~100 replays/s (a gpu-bound
  model; the tiny MLP measured replayed ~9,700/s), two graphs captured
  (cudaStreamBeginCapture, cudaStreamEndCapture) and instantiated (cudaGraphInstantiate) in
  the first interval.
- ``inference``: inference servers (``WorkloadProfile.servers``, one per GPU), each stepping
  one decode stream as an engine does (what ``docs/fleet-push.md`` "Inference servers" reads
  and ``tests/integration/trace/stream_engine.c`` imitates): a step is the gap between two
  cudaStreamSynchronize calls on the stream, nine decode steps then one prefill step on
  the same stream, the kernels launched through the runtime. Written as the tracer writes
  them (node DB version 6): per server and interval a ``stream_intervals`` row (its syncs,
  launches, steps, their total time and histogram) and a cudaStreamSynchronize interval
  row of the server's pid (``WorkloadProfile.pid`` + its index); the launches, off-CPU and
  GPU rows are the node's, under ``WorkloadProfile.pid``. All assumed: a decode step of
  25 ms and a prefill of 150 ms (an 8B model on an H100 at a moderate batch), 20 launches
  a step (graphs replayed for decode, sampling kernels around them).

What the reference did not measure is an assumption, named as such in ``SHAPES``: NVML
utilization (15% for the CPU-bound loop, as the one nvidia-smi reading showed; 98% for the
GPU-bound one), GPU memory used, clocks, power, temperature, the gpu-bound loop's off-CPU
time, and the host's CPU and memory. Percentiles are drawn around the measured means.

A slowdown ``s`` is the process doing ``1 - s`` of its work per second (the reference slowed a
process by sleeping): every call rate and the GPU's busy time scale by ``1 - s`` and the
sleeping thread adds ``s`` seconds off-CPU per second; the host's CPU is left as it was, so
detection never leans on it. Of several inference servers only the first is slowed (one
slow replica: its steps take ``1 / (1 - s)`` as long), and the node's rows scale with the
servers' mean speed; a stall stops them all. A stall is the process stopped (SIGSTOP, a hang): no calls and no
context switches are recorded, the GPU reads 0% busy, and the process still holds its GPU
memory and is still listed on the GPU.

A slowdown can also have a *cause* (``CAUSES``): the work still falls by ``s``, and the rows
show what that cause shows on a real node (``cause_effect``): ``cpu`` more off-CPU time and
context switches of the process's threads and a busier host CPU; ``io`` blocking reads (off-CPU
time, block I/O requests and latency, page-cache allocations); ``alloc`` cuMemAlloc calls in
the loop; ``throttle`` NVML's thermal slowdown reason and a lower SM clock, the GPU as busy as
before but slower; ``net`` TCP retransmits, the GPU waiting in its collectives;
``recapture`` the graphs captured and instantiated again in the loop, costing the host
that time.

Pure apart from its seeded random generator: ``tick`` takes the interval bounds, the slowdown
and whether the process is stalled, and returns the rows; the runner writes them.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from ingero.collectors.nvml import GpuProcess, GpuReading, NvmlReading
from ingero.trace.aggregate import slot_of
from ingero.trace.gpusampler import reading_rows

H100_MEMORY_BYTES: Final = 81_559 * 2**20  # what NVML reports for an H100 80GB HBM3


@dataclass(frozen=True)
class Shape:
    """Per-process rates of one training loop (measured unless the comment says assumed)."""

    launch_rate: float  # kernel launches per second (``launch_op``)
    launch_ns: float  # mean host time of one launch call
    sync_rate: float  # cudaDeviceSynchronize calls per second
    sync_ns: float
    memcpy_rate: float  # cudaMemcpyAsync calls per second
    memcpy_ns: float
    offcpu_switches: float  # context switches per second (sched_switch)
    offcpu_s: float  # seconds off-CPU per second, over all threads of the process
    startup_allocs: int  # cuMemAlloc calls in the first interval
    gpu_util: float  # assumed: NVML utilization at full speed
    gpu_mem_used_bytes: int  # assumed (cpu-bound: as the reference's nvidia-smi showed)
    power_w: float  # assumed
    temperature_c: int  # assumed
    host_cpu_busy: float  # assumed: busy share of the host's CPUs
    host_mem_available: float  # assumed: MemAvailable / MemTotal
    graph_launch_rate: float = 0.0  # cudaGraphLaunch calls per second
    graph_launch_ns: float = 0.0
    startup_graphs: int = 0  # graphs captured and instantiated in the first interval
    # Where the launches are recorded: PyTorch's eager kernels through the driver, a graph
    # replay's input copy through the runtime.
    launch_op: tuple[str, str] = ("cuda_driver", "cuLaunchKernel")
    # An inference server's decode stream (0: none): its decode step, its prefill step, and
    # how often a step is a prefill; its launches are ``launch_rate`` / its steps per second.
    decode_ms: float = 0.0
    prefill_ms: float = 0.0
    prefill_every: int = 0


# assumed: kernel launches of one inference step (decode graphs replayed, sampling around)
STEP_LAUNCHES: Final = 20

# A launch with room in the launch queue costs the host this (measured: the cpu-bound loop);
# a longer launch waited for the GPU to drain the queue.
LAUNCH_HOST_NS: Final = 6_500.0

SHAPES: Final = MappingProxyType(
    {
        "cpu-bound": Shape(
            launch_rate=19_500.0,
            launch_ns=LAUNCH_HOST_NS,
            sync_rate=16.0,
            sync_ns=20_000.0,
            memcpy_rate=0.0,
            memcpy_ns=0.0,
            offcpu_switches=600.0,
            offcpu_s=2.0,
            startup_allocs=4,
            gpu_util=0.15,
            gpu_mem_used_bytes=480 * 2**20,
            power_w=140.0,
            temperature_c=38,
            host_cpu_busy=0.3,
            host_mem_available=0.6,
        ),
        "gpu-bound": Shape(
            launch_rate=3_484.0,
            launch_ns=184_000.0,
            sync_rate=1.0,
            sync_ns=218_000_000.0,
            memcpy_rate=189.0,
            memcpy_ns=119_000.0,
            offcpu_switches=32.0,
            offcpu_s=0.3,  # assumed: the reference measured only the switch rate
            startup_allocs=0,
            gpu_util=0.98,
            gpu_mem_used_bytes=18 * 2**30,
            power_w=610.0,
            temperature_c=62,
            host_cpu_busy=0.25,
            host_mem_available=0.6,
        ),
        # The gpu-bound loop replaying CUDA graphs (torch.compile mode="reduce-overhead"):
        # measured on an H200 (PyTorch 2.11, CUDA 13): cudaGraphLaunch of ~4.1 µs and one
        # cudaLaunchKernel of ~7.3 µs per replay (the input copy), nothing through the
        # driver, no cudaMemcpyAsync. Assumed: ~100 replays/s (the rate issue 26's eval
        # used), two graphs (forward, backward) captured and instantiated at start; the rest
        # as the gpu-bound loop.
        "graphs": Shape(
            launch_rate=100.0,
            launch_ns=7_300.0,
            sync_rate=1.0,
            sync_ns=218_000_000.0,
            memcpy_rate=0.0,
            memcpy_ns=0.0,
            offcpu_switches=32.0,
            offcpu_s=0.3,
            startup_allocs=4,
            gpu_util=0.98,
            gpu_mem_used_bytes=20 * 2**30,
            power_w=610.0,
            temperature_c=62,
            host_cpu_busy=0.2,
            host_mem_available=0.6,
            graph_launch_rate=100.0,
            graph_launch_ns=4_100.0,
            startup_graphs=2,
            launch_op=("cuda_runtime", "cudaLaunchKernel"),
        ),
        # One inference server (see the module's docstring; all assumed): 9 decode steps of
        # 25 ms and a prefill of 150 ms per 375 ms, 26.7 steps/s of 20 launches each; its
        # syncs are the stream's (written per server), none through cudaDeviceSynchronize.
        "inference": Shape(
            launch_rate=STEP_LAUNCHES * 10 / 0.375,
            launch_ns=7_300.0,
            sync_rate=0.0,
            sync_ns=0.0,
            memcpy_rate=0.0,
            memcpy_ns=0.0,
            offcpu_switches=200.0,
            offcpu_s=0.5,
            startup_allocs=4,
            gpu_util=0.9,
            gpu_mem_used_bytes=70 * 2**30,  # weights and the KV cache fill the GPU
            power_w=550.0,
            temperature_c=60,
            host_cpu_busy=0.2,
            host_mem_available=0.6,
            launch_op=("cuda_runtime", "cudaLaunchKernel"),
            decode_ms=25.0,
            prefill_ms=150.0,
            prefill_every=10,
        ),
    }
)
SHAPE_NAMES: Final = tuple(SHAPES)
# GPU-bound: the case a busy GPU reads near 100% in NVML.
DEFAULT_SHAPE: Final = "gpu-bound"
SM_CLOCK_MHZ: Final = 1980  # H100 SXM maximum SM clock
SW_POWER_CAP: Final = 0x4  # NVML clock event reasons (ingero.collectors.nvml.THROTTLE_REASONS)
SW_THERMAL_SLOWDOWN: Final = 0x20
# The host's own activity, node-wide (assumed: a quiet node whose data set is in page cache).
HOST_PAGE_ALLOCS_PER_S: Final = 500.0
HOST_BLOCK_IO_PER_S: Final = 20.0
HOST_BLOCK_IO_P99_NS: Final = 400_000

CAUSES: Final = ("cpu", "io", "alloc", "throttle", "net", "recapture")
# How each cause is written (``cause_effect``); measured where the reference measured it.
SCHED_SLICE_S: Final = 0.003  # the scheduler's base slice on 8+ CPUs (0.75 ms x (1 + log2 8))
IO_READ_S: Final = 0.002  # assumed: mean wait of one read from congested storage
IO_P99_NS: Final = 12_000_000  # assumed: that storage's p99
READAHEAD_PAGES: Final = 32  # one read's page-cache pages (128 KiB readahead, 4 KiB pages)
ALLOC_NS: Final = 144_000.0  # one cuMemAlloc (measured: the reference's start-up allocations)
# assumed: 2,000 retransmits/s at a 100% loss of work (~0.5% of the job's ~1 GB/s of NCCL
# socket traffic lost at a 30% slowdown)
RETRANSMITS_PER_SLOWDOWN: Final = 2_000.0
THROTTLE_TEMPERATURE_C: Final = 87  # assumed: where an H100 starts its thermal slowdown
# assumed: host time to capture one graph (begin..end: the step's launches recorded, not run)
# and to instantiate it (the driver builds the executable graph)
CAPTURE_NS: Final = 2_000_000.0
INSTANTIATE_NS: Final = 8_000_000.0
# The first inference server's decode stream handle (stream_engine.c's); server i adds i.
DECODE_STREAM: Final = 0x7F00C0DE0000
# assumed: the host waits in the stream sync for this share of a step (the GPU runs it)
SYNC_SHARE: Final = 0.8


@dataclass(frozen=True)
class CauseEffect:
    """What a slowdown of ``s`` with a cause adds to one second of a process's rows.

    ``host_waits``: the GPU waits for the host (its busy time falls with the work); else the
    host waits for the GPU (the GPU stays as busy, each call that waits for it, a sync or a
    launch into a full queue, waits ``gpu_wait`` times as long).
    """

    host_waits: bool = True
    gpu_wait: float = 1.0
    offcpu_s: float = 0.0  # seconds off-CPU per second, over the process's threads
    switches: float = 0.0  # context switches per second
    host_cpu_taken: float = 0.0  # share of the host's idle CPU another process takes
    allocs: float = 0.0  # cuMemAlloc calls per second
    reads: float = 0.0  # blocking block-device reads per second
    retransmits: float = 0.0  # TCP retransmits per second (node-wide)
    captures: float = 0.0  # graphs captured and instantiated per second
    throttled: bool = False  # NVML reports a thermal slowdown; the SM clock falls with the work


def cause_effect(cause: str | None, slowdown: float, shape: Shape) -> CauseEffect:
    """The rows' change when ``cause`` costs the process ``slowdown`` of its work per second."""
    s = slowdown
    if cause is None:
        # No cause: the process sleeps (as the reference slowed a process), s seconds per second.
        return CauseEffect(offcpu_s=s)
    if cause == "cpu":
        # Another process holds a share h of the process's CPUs; with both runnable, the fair
        # share costs the launching thread h / 2 = s of its time, lost in slices, and every
        # wake-up of the process's other threads finds its CPU taken with chance h and waits
        # half a slice on average (sched_switch counts that wait as off-CPU).
        h = min(1.0, 2.0 * s)
        wakeup_wait = shape.offcpu_switches * h * SCHED_SLICE_S / 2
        return CauseEffect(offcpu_s=s + wakeup_wait, switches=s / SCHED_SLICE_S, host_cpu_taken=h)
    if cause == "io":
        # The input pipeline's reads miss the page cache: the thread blocks in s / IO_READ_S
        # reads per second, each a switch, a block request and a readahead of new pages.
        reads = s / IO_READ_S
        return CauseEffect(offcpu_s=s, switches=reads, reads=reads)
    if cause == "alloc":
        # Memory is allocated and freed in the loop: each cuMemAlloc and its cuMemFree (which
        # synchronises with the GPU; not traced, assumed to cost as much) spin on the CPU.
        return CauseEffect(allocs=s * 1e9 / (2 * ALLOC_NS))
    if cause == "throttle":
        return CauseEffect(host_waits=False, gpu_wait=1 / (1 - s), throttled=True)
    if cause == "net":
        # The collectives wait for retransmitted segments on the GPU (NCCL's kernels spin).
        return CauseEffect(
            host_waits=False, gpu_wait=1 / (1 - s), retransmits=s * RETRANSMITS_PER_SLOWDOWN
        )
    if cause == "recapture":
        # The graphs are captured and instantiated again in the loop (a dynamic shape, a
        # guard that fails, a graph pool evicted): the host spends s seconds a second on it.
        return CauseEffect(captures=s * 1e9 / (CAPTURE_NS + INSTANTIATE_NS))
    raise ValueError(f"cause must be one of {', '.join(CAUSES)}, got {cause!r}")


@dataclass(frozen=True)
class WorkloadProfile:
    """One training process of one node (rank), driving ``gpus`` GPUs."""

    shape: str = DEFAULT_SHAPE
    gpus: int = 1
    noise: float = 0.03  # relative standard deviation of every per-interval rate
    launch_rate: float | None = None  # overrides the shape's launches per second
    gpu_busy: float | None = None  # overrides the shape's NVML utilization
    gpu_mem_used: float | None = None  # GiB; overrides the shape's GPU memory used
    pid: int = 4242
    job_id: str | None = None
    rank: int | None = None
    servers: int = 1  # inference servers (shape ``inference``), pids ``pid`` + 0, 1, ...

    @property
    def rates(self) -> Shape:
        return SHAPES[self.shape]

    def validate(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"shape must be one of {', '.join(SHAPES)}, got {self.shape!r}")
        rate = self.launch_rate
        if rate is not None and not (rate > 0 and math.isfinite(rate)):
            raise ValueError("launch_rate must be a finite number > 0")
        if self.gpus < 1:
            raise ValueError("gpus must be >= 1")
        if self.gpu_busy is not None and not 0 < self.gpu_busy <= 1:
            raise ValueError("gpu_busy must be in (0, 1]")
        if (
            self.gpu_mem_used is not None
            and not 0 <= self.gpu_mem_used * 2**30 <= H100_MEMORY_BYTES
        ):
            raise ValueError(f"gpu_mem_used must be in [0, {H100_MEMORY_BYTES / 2**30:.1f}] GiB")
        if not 0 <= self.noise < 0.5:
            raise ValueError("noise must be in [0, 0.5)")
        if not 1 <= self.servers <= 64:
            raise ValueError("servers must be in [1, 64]")

    @property
    def server_pids(self) -> tuple[int, ...]:
        """The inference servers' pids; none for a training shape."""
        return tuple(self.pid + i for i in range(self.servers)) if self.rates.decode_ms else ()


@dataclass(frozen=True)
class Activity:
    """What a process did in one interval, as the rows show it.

    ``speed``: the share of its full-speed work it did (every call rate scales by it);
    ``effect``: what its slowdown's cause adds (``cause_effect``); ``stalled``: stopped (no
    calls, no context switches); ``gpu_speed``: what scales NVML's utilization (a GPU
    spinning in an NCCL kernel is busy while its host waits); ``clock_speed`` and
    ``power_speed``: what scales a throttled GPU's clock and the power drawn (None:
    ``speed``); ``syncs``: the interval's synchronize calls as (op, count, total ns)
    instead of the shape's ``cudaDeviceSynchronize`` rate (a lock-step rank's one stream
    sync a step, where it waits for its peers).
    """

    speed: float
    effect: CauseEffect = field(default_factory=CauseEffect)
    stalled: bool = False
    gpu_speed: float = 1.0
    clock_speed: float | None = None
    power_speed: float | None = None
    syncs: tuple[str, int, float] | None = None


@dataclass
class TickRows:
    intervals: list[dict[str, Any]] = field(default_factory=list)
    gpu_intervals: list[dict[str, Any]] = field(default_factory=list)
    gpu_processes: list[dict[str, Any]] = field(default_factory=list)
    host_intervals: list[dict[str, Any]] = field(default_factory=list)
    stream_intervals: list[dict[str, Any]] = field(default_factory=list)
    cpu_busy: float = 0.0  # for the synthetic /proc/stat
    mem_available: float = 1.0  # for the synthetic /proc/meminfo


class WorkloadGenerator:
    """Produces one interval's rows; ``slowdown`` 0.3 means 30% less work per second."""

    def __init__(self, profile: WorkloadProfile, seed: int | None = None) -> None:
        profile.validate()
        self.profile = profile
        self.rng = random.Random(seed)
        self._started = False
        # Fractions of a call carried to the next interval, so rare calls (1/s) still appear
        # at the right rate in short intervals.
        self._carry: dict[str, float] = {}

    def _jitter(self) -> float:
        # Clipped so a rare draw never makes a rate negative.
        return max(0.5, self.rng.gauss(1.0, self.profile.noise))

    def tick(
        self,
        ts_start: float,
        ts_end: float,
        slowdown: float = 0.0,
        stalled: bool = False,
        cause: str | None = None,
    ) -> TickRows:
        """One interval's rows; ``cause`` says what the ``slowdown`` comes from (None: a sleep)."""
        if ts_end <= ts_start:
            raise ValueError("an interval must end after it starts")
        if not 0 <= slowdown < 1:
            raise ValueError(f"slowdown must be in [0, 1), got {slowdown!r}")
        if cause is not None and cause not in CAUSES:
            raise ValueError(f"cause must be one of {', '.join(CAUSES)}, got {cause!r}")
        # A stopped process does nothing at all, whatever slowed it before; a cause without a
        # slowdown is not there.
        slowed = slowdown > 0 and not stalled
        effect = cause_effect(
            cause if slowed else None, slowdown if slowed else 0.0, self.profile.rates
        )
        speed = 0.0 if stalled else 1.0 - slowdown
        return self.interval(
            ts_start,
            ts_end,
            Activity(
                speed=speed,
                effect=effect,
                stalled=stalled,
                gpu_speed=speed if effect.host_waits else (0.0 if stalled else 1.0),
            ),
        )

    def interval(self, ts_start: float, ts_end: float, activity: Activity) -> TickRows:
        """One interval's rows for what the process did in it (``tick`` for a process on
        its own; ``ingero.workload.lockstep`` for a rank of a lock-step job)."""
        if ts_end <= ts_start:
            raise ValueError("an interval must end after it starts")
        p, shape = self.profile, self.profile.rates
        effect, stalled, speed = activity.effect, activity.stalled, activity.speed
        dt = ts_end - ts_start
        stream_rows: list[dict[str, Any]] = []
        if shape.decode_ms:
            # Only the first server is slowed: the node's rows go at the servers' mean speed.
            speeds = [speed] + [0.0 if stalled else 1.0] * (p.servers - 1)
            stream_rows = self._streams(ts_start, ts_end, speeds)
            speed = sum(speeds) / len(speeds)
        tags = {"pid": p.pid, "job_id": p.job_id, "rank": p.rank}
        cpu_busy = shape.host_cpu_busy * self._jitter()
        rows = TickRows(
            cpu_busy=min(1.0, cpu_busy + effect.host_cpu_taken * max(0.0, 1.0 - cpu_busy)),
            mem_available=min(1.0, shape.host_mem_available * self._jitter()),
        )

        def calls(source: str, op: str, per_s: float, each_ns: float, work: float = speed) -> None:
            exact = per_s * dt * work * self._jitter() + self._carry.get(op, 0.0)
            count = int(exact)
            self._carry[op] = exact - count
            if count <= 0:
                return
            mean = each_ns * self._jitter()
            rows.intervals.append(
                {
                    "ts_start": ts_start,
                    "ts_end": ts_end,
                    **tags,
                    "source": source,
                    "op": op,
                    "count": count,
                    "total_ns": int(count * mean),
                    "p50_ns": int(mean * 0.85),
                    "p95_ns": int(mean * 2.0),
                    "p99_ns": int(mean * 3.5),
                    "errors": 0,
                    "bytes": 0,
                }
            )

        launch_rate = p.launch_rate if p.launch_rate is not None else shape.launch_rate
        launch_rate *= len(p.server_pids) or 1
        queue_wait = max(0.0, shape.launch_ns - LAUNCH_HOST_NS)
        launch_ns = shape.launch_ns - queue_wait + queue_wait * effect.gpu_wait
        if launch_rate > 0:
            calls(*shape.launch_op, launch_rate, launch_ns)
        if shape.graph_launch_rate > 0:
            # A replay launches the whole graph: it waits for the GPU only as a launch does.
            calls("cuda_runtime", "cudaGraphLaunch", shape.graph_launch_rate, shape.graph_launch_ns)
        captures = effect.captures + (0.0 if self._started else shape.startup_graphs / dt)
        if captures and not stalled:
            for op, each_ns in (
                ("cudaStreamBeginCapture", 5_000.0),
                ("cudaStreamEndCapture", CAPTURE_NS),
                ("cudaGraphInstantiate", INSTANTIATE_NS),
            ):
                calls("cuda_runtime", op, captures, each_ns, work=1.0)
        if activity.syncs is None:
            calls(
                "cuda_runtime",
                "cudaDeviceSynchronize",
                shape.sync_rate,
                shape.sync_ns * effect.gpu_wait,
            )
        else:
            op, count, total_ns = activity.syncs
            if count > 0:
                mean = total_ns / count
                rows.intervals.append(
                    {"ts_start": ts_start, "ts_end": ts_end, **tags, "source": "cuda_runtime",
                     "op": op, "count": count, "total_ns": int(total_ns),
                     "p50_ns": int(mean * 0.85), "p95_ns": int(mean * 2.0),
                     "p99_ns": int(mean * 3.5), "errors": 0, "bytes": 0}
                )  # fmt: skip
        calls("cuda_runtime", "cudaMemcpyAsync", shape.memcpy_rate, shape.memcpy_ns)
        allocs = effect.allocs + (0.0 if self._started else shape.startup_allocs / dt)
        if allocs and not stalled:
            calls("cuda_driver", "cuMemAlloc", allocs, ALLOC_NS, work=1.0)
        self._started = True
        offcpu_ns = 0
        if not stalled:
            # A stopped process is not scheduled: no switches, no row. Sleeping adds off-CPU time.
            offcpu_ns = int((shape.offcpu_s * self._jitter() + effect.offcpu_s) * dt * 1e9)
            switches = round((shape.offcpu_switches * self._jitter() + effect.switches) * dt)
            if switches:
                rows.intervals.append(
                    {"ts_start": ts_start, "ts_end": ts_end, **tags, "source": "host",
                     "op": "offcpu", "count": switches, "total_ns": offcpu_ns,
                     "p50_ns": offcpu_ns // (2 * switches), "p95_ns": offcpu_ns // switches,
                     "p99_ns": 2 * offcpu_ns // switches, "errors": 0, "bytes": 0}
                )  # fmt: skip
        gpu_speed = activity.gpu_speed
        if shape.decode_ms:
            gpu_speed = speed if effect.host_waits else (0.0 if stalled else 1.0)
        gpu_rows = reading_rows(
            self._nvml(
                gpu_speed,
                effect,
                speed if activity.clock_speed is None else activity.clock_speed,
                speed if activity.power_speed is None else activity.power_speed,
            ),
            ts_start,
            ts_end,
        )
        rows.gpu_intervals = gpu_rows.intervals
        rows.gpu_processes = gpu_rows.processes
        rows.stream_intervals = stream_rows
        for row in stream_rows:
            rows.intervals.append(
                {"ts_start": ts_start, "ts_end": ts_end, "pid": row["pid"],
                 "job_id": p.job_id, "rank": p.rank, "source": "cuda_runtime",
                 "op": "cudaStreamSynchronize", "count": row["syncs"], "total_ns": row["sync_ns"],
                 "p50_ns": row["step_p50_ns"], "p95_ns": row["step_p90_ns"],
                 "p99_ns": row["step_p90_ns"], "errors": 0, "bytes": 0}
            )  # fmt: skip
        rows.host_intervals.append(
            {
                "ts_start": ts_start,
                "ts_end": ts_end,
                "offcpu_ns": offcpu_ns,
                "page_allocs": int(
                    (HOST_PAGE_ALLOCS_PER_S * self._jitter() + effect.reads * READAHEAD_PAGES) * dt
                ),
                "block_io_count": int((HOST_BLOCK_IO_PER_S * self._jitter() + effect.reads) * dt),
                "block_io_p99_ns": IO_P99_NS if effect.reads else HOST_BLOCK_IO_P99_NS,
                # (drawn only when there are any: a cause leaves the healthy rows' noise as it was)
                "tcp_retransmits": (
                    round(effect.retransmits * dt * self._jitter()) if effect.retransmits else 0
                ),
                "dropped_events": 0,
            }
        )
        return rows

    def _streams(self, ts_start: float, ts_end: float, speeds: list[float]) -> list[dict[str, Any]]:
        """Each inference server's decode stream over the interval, as the tracer writes it:
        at ``speeds[i]`` of full speed server i's steps take ``1 / speed`` as long."""
        p, shape = self.profile, self.profile.rates
        every = max(1, shape.prefill_every)
        out = []
        for i, (pid, speed) in enumerate(zip(p.server_pids, speeds, strict=True)):
            if speed <= 0:
                continue  # a stopped server syncs nothing
            decode_ns = shape.decode_ms * 1e6 / speed * self._jitter()
            prefill_ns = shape.prefill_ms * 1e6 / speed * self._jitter()
            cycle_ns = (every - 1) * decode_ns + (prefill_ns if shape.prefill_every else decode_ns)
            key = f"steps{i}"
            exact = (ts_end - ts_start) * 1e9 * every / cycle_ns + self._carry.get(key, 0.0)
            steps = int(exact)
            self._carry[key] = exact - steps
            if steps <= 0:
                continue
            prefills = 0
            if shape.prefill_every:
                due = steps / every + self._carry.get(f"prefill{i}", 0.0)
                prefills = min(steps, int(due))
                self._carry[f"prefill{i}"] = due - prefills
            decodes = steps - prefills
            hist: dict[int, int] = {}
            for n, each in ((decodes, decode_ns), (prefills, prefill_ns)):
                if n:
                    slot = slot_of(int(each))
                    hist[slot] = hist.get(slot, 0) + n
            total = int(decodes * decode_ns + prefills * prefill_ns)
            out.append(
                {"ts_start": ts_start, "ts_end": ts_end, "pid": pid, "job_id": p.job_id,
                 "rank": p.rank, "stream": f"{DECODE_STREAM + i:016x}", "syncs": steps,
                 "sync_ns": int(total * SYNC_SHARE),
                 "launches": steps * STEP_LAUNCHES,
                 "steps": steps, "step_ns": total, "step_p50_ns": int(decode_ns),
                 "step_p90_ns": int(prefill_ns if prefills else decode_ns),
                 "step_hist": json.dumps({str(k): v for k, v in sorted(hist.items())})}
            )  # fmt: skip
        return out

    def _nvml(
        self, busy_speed: float, effect: CauseEffect, speed: float, power_speed: float
    ) -> NvmlReading:
        """What NVML would report of this process's GPUs now (one reading per interval):
        ``busy_speed`` scales the utilization, ``speed`` the clock when throttled,
        ``power_speed`` the power drawn."""
        p, shape = self.profile, self.profile.rates
        util = p.gpu_busy if p.gpu_busy is not None else shape.gpu_util
        gpus = []
        for index in range(p.gpus):
            # NVML reports whole percents.
            busy = min(100, max(0, round(100 * util * busy_speed * self._jitter()))) / 100
            used = (
                shape.gpu_mem_used_bytes
                if p.gpu_mem_used is None
                else round(p.gpu_mem_used * 2**30)
            )
            if effect.throttled:
                # Hot: the clock falls with the work, and so does the power drawn.
                clock, reasons, temperature = (
                    round(SM_CLOCK_MHZ * speed),
                    SW_THERMAL_SLOWDOWN,
                    THROTTLE_TEMPERATURE_C,
                )
            else:
                # A GPU-bound loop runs into the software power cap now and then.
                clock, reasons = SM_CLOCK_MHZ, SW_POWER_CAP if busy > 0.95 else 0
                temperature = shape.temperature_c
            gpus.append(
                GpuReading(
                    index=index,
                    utilization=busy,
                    mem_used_bytes=used,
                    mem_free_bytes=H100_MEMORY_BYTES - used,
                    mem_total_bytes=H100_MEMORY_BYTES,
                    sm_clock_mhz=clock,
                    sm_clock_max_mhz=SM_CLOCK_MHZ,
                    throttle_reasons=reasons,
                    temperature_c=temperature,
                    power_w=round(shape.power_w * max(0.15, power_speed) * self._jitter(), 1),
                    ecc_corrected=0,
                    ecc_uncorrected=0,
                    # An H100 remaps rows; it does not retire pages (NVML: not supported).
                    remapped_rows_correctable=0,
                    remapped_rows_uncorrectable=0,
                    remap_pending=False,
                    remap_failure=False,
                    xids=(),
                    processes=(GpuProcess(p.pid, used, p.job_id, p.rank),),
                )
            )
        return NvmlReading(gpus=tuple(gpus))
