"""A lock-step training job: N ranks, every step ending in collectives no rank leaves before
the last rank has arrived, so every rank runs at the pace of the slowest.

What synchronous data-parallel training (PyTorch DDP, FSDP, Megatron) looks like from each
node, written as ``ingero trace`` writes it:

- **One pace.** A step of ``step_s`` (assumed: 1 s, as the issue's job) holds the shape's
  kernel launches (driver API, the launch queue full for ``gpu-bound``), its memcpys,
  ``collectives`` ``ncclAllReduce`` calls (DDP's gradient buckets, 25 MiB each, entered
  between ``FIRST_AT`` and ``LAST_AT`` of the step: during the backward pass) and one
  ``cudaStreamSynchronize`` at its end (``loss.item()``). A rank's own compute takes
  ``step_s / (1 - s)`` at a slowdown ``s``; the step ends for every rank once the slowest
  has done its share: ``max`` over the ranks, times the job's own step noise (shared by
  every rank: a step is as long on each of them). So every rank launches, syncs and enters
  collectives at the same rate.
- **Where the healthy ranks wait.** ``ncclAllReduce`` returns at enqueue (``ENQUEUE_NS``);
  the wait is in the end-of-step stream sync, which on a healthy rank lasts the shape's
  GPU lead plus the time it waits for the slowest rank, on the slowest only the lead. NVML
  reads a waiting GPU as busy (NCCL's kernel spins), at a lower power (``SPIN_POWER``).
- **What tells the slow rank.** Its arrivals: each collective is entered at its share of
  the rank's own step, so a rank whose host is slow (any host cause, or a plain sleep)
  enters late, and so does one whose GPU is slow in a job with a full launch queue (the
  host tracks its GPU's progress); with the host ahead of the GPU (``cpu-bound``), a slow
  GPU leaves the arrivals on time. NVML: a throttled GPU's reasons and clock (``throttle``);
  a GPU slower with NVML silent (``gpu``: nothing in NVML, the arrivals alone tell); a
  host-slow rank's GPU idles for its host (busy falls by ``s``).
- **A hang** (:meth:`LockstepJob.hang`): the rank stops right before its next collective
  (its process alive, its GPU memory held, its queue drained: the GPU idle). The others
  enter that collective, return, go on enqueuing up to ``QUEUE_LAUNCHES`` launches (the
  launch queue) or to the end of their step's work, and wait there (a launch into the full
  queue, or the stream sync): no call returns, nothing is written but the intervals' host
  rows and the GPU spinning, busy.
- **A hang on a lost GPU** (:meth:`LockstepJob.lose_gpu`): the hung rank's GPU fell off the
  bus (XID 79): its NVML rows say the GPU is lost (the XID in the first), everything else
  unmeasured, as ``ingero.collectors.nvml`` reads such a GPU; its process lists are gone.
- **Every rank stuck inside one** (:meth:`LockstepJob.stuck`: a link down, a NIC, NVLink, a
  GPU fault): the collective in flight never completes; every rank enters it and waits as
  above. None is missing.
- **A phase change** (:meth:`LockstepJob.phase`): every rank's step is longer by the same
  factor from the next step on (evaluation, longer sequences); the GPUs as busy.

Each rank's rows are its own :class:`~ingero.workload.generator.WorkloadGenerator`'s (its
own noise, its own pid, job and rank tags), plus ``nccl_calls`` (every collective: a few a
second are far below the tracer's sampling cap) and one ``nccl_comms`` row per interval,
with one communicator hash shared by every rank and shared sequence numbers. Pure apart
from its seeded random generators; controls apply to the steps that begin at or after
the time they are given (a step's length is fixed when it begins).
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass, field, replace
from typing import Any, Final

from ingero.collectors.nvml import GpuReading, NvmlReading
from ingero.trace.gpusampler import reading_rows
from ingero.workload.generator import (
    CAUSES,
    DEFAULT_SHAPE,
    LAUNCH_HOST_NS,
    SHAPES,
    Activity,
    CauseEffect,
    TickRows,
    WorkloadGenerator,
    WorkloadProfile,
    cause_effect,
)

DEFAULT_RANKS: Final = 8
STEP_S: Final = 1.0  # assumed: a healthy rank's step (the measured job)
COLLECTIVES: Final = 8  # ncclAllReduce per step (DDP's gradient buckets)
BUCKET_BYTES: Final = 25 * 2**20  # DDP's default bucket_cap_mb
# assumed: the share of a step before the first bucket is ready (forward and the last
# layers' backward), and where the last one goes (the rest is the optimizer step)
FIRST_AT: Final = 0.45
LAST_AT: Final = 0.95
QUEUE_LAUNCHES: Final = 1024  # CUDA's launch queue (about a thousand entries)
ENQUEUE_NS: Final = 25_000  # assumed: an ncclAllReduce call returning at enqueue
ARRIVAL_JITTER_S: Final = 0.002  # assumed: scheduling jitter of one rank's arrival
STEP_NOISE: Final = 0.005  # assumed: one rank's own compute varies this much a step (sd)
SPIN_POWER: Final = 0.6  # assumed: NCCL's spinning kernel draws this share of a GEMM's power
SYNC_OP: Final = "cudaStreamSynchronize"
XID_FALLEN_OFF_BUS: Final = 79  # NVIDIA's XID for a GPU that fell off the bus
COLLECTIVE_OP: Final = "ncclAllReduce"
# The causes a rank's slowdown may have: the generator's, and a GPU slower than its peers
# with nothing in NVML (a degraded part without a clock event reason).
GPU_SILENT: Final = "gpu"
LOCKSTEP_CAUSES: Final = (*CAUSES, GPU_SILENT)
_GPU_CAUSES: Final = frozenset({"throttle", "net", GPU_SILENT})
# The shapes that run as one rank of a training job (an inference server is a replica).
LOCKSTEP_SHAPES: Final = tuple(name for name, shape in SHAPES.items() if not shape.decode_ms)


@dataclass(frozen=True)
class JobProfile:
    """The job: its ranks (one a node) and what each rank's process is like."""

    ranks: int = DEFAULT_RANKS
    shape: str = DEFAULT_SHAPE
    step_s: float = STEP_S
    collectives: int = COLLECTIVES
    noise: float = 0.03  # each rank's per-interval rows (WorkloadProfile.noise)
    job_noise: float = 0.02  # the job's step time, the same on every rank (sd)
    job_id: str | None = None
    pid: int = 4242  # rank r's process: pid + r (None of them exists: rows only)
    same_pid: bool = False  # every rank's rows under ``pid`` (one process writes them all)
    gpus: int = 1
    gpu_mem_used: float | None = None  # GiB per GPU (None: the shape's)

    def validate(self) -> None:
        if not 2 <= self.ranks <= 1024:
            raise ValueError("ranks must be in [2, 1024]")
        if self.shape not in LOCKSTEP_SHAPES:
            raise ValueError(
                f"a lock-step job's shape must be one of {', '.join(LOCKSTEP_SHAPES)}, "
                f"got {self.shape!r}"
            )
        if not (0.05 <= self.step_s <= 600 and math.isfinite(self.step_s)):
            raise ValueError("step_s must be in [0.05, 600]")
        if not 1 <= self.collectives <= 1024:
            raise ValueError("collectives must be in [1, 1024]")
        if not 0 <= self.job_noise < 0.5:
            raise ValueError("job_noise must be in [0, 0.5)")

    def rank_profile(self, rank: int) -> WorkloadProfile:
        return WorkloadProfile(
            shape=self.shape,
            gpus=self.gpus,
            noise=self.noise,
            gpu_mem_used=self.gpu_mem_used,
            pid=self.pid if self.same_pid else self.pid + rank,
            job_id=self.job_id,
            rank=rank,
        )


@dataclass
class RankRows(TickRows):
    """One rank's interval: the generator's rows and its NCCL rows."""

    nccl_calls: list[dict[str, Any]] = field(default_factory=list)
    nccl_comms: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class RankSlowdown:
    slowdown: float = 0.0
    cause: str | None = None

    @property
    def factor(self) -> float:
        return 1.0 / (1.0 - self.slowdown)


@dataclass
class _Step:
    """One step of the job: when it began, when it ends for every rank (inf: it never
    does, held up by a hang), and per rank its arrivals, when its own share of the step's
    work was done, the time spans it worked, and its slowdown then."""

    index: int
    start: float
    end: float
    arrivals: list[list[float]]  # [rank][collective]; inf: never entered
    host_end: list[float]
    spans: list[list[tuple[float, float]]]
    work: list[float]  # seconds of work the spans hold in all, per rank
    slow: list[RankSlowdown]


def comm_hash_of(job_id: str | None, seed: int | None) -> str:
    """The job's communicator hash: 16 lowercase hex digits, the same on every rank."""
    digest = hashlib.blake2b(f"{job_id}/{seed}".encode(), digest_size=8).hexdigest()
    return digest


class LockstepJob:
    """The job's timeline and each rank's rows of it (see the module docstring)."""

    def __init__(self, profile: JobProfile, start: float, seed: int | None = None) -> None:
        profile.validate()
        self.profile = profile
        self.shape = SHAPES[profile.shape]
        self.rng = random.Random(seed)
        self.gens = [
            WorkloadGenerator(
                profile.rank_profile(r), seed=None if seed is None else seed * 1000 + r
            )
            for r in range(profile.ranks)
        ]
        self.comm_hash = comm_hash_of(profile.job_id, seed)
        self.start = start
        self.steps: list[_Step] = []
        self.slow = [RankSlowdown() for _ in range(profile.ranks)]
        self.phase_factor = 1.0
        # A rank that hangs at its next collective after a time, or every rank stuck in
        # the collective in flight at a time (None: neither); a hang holds until released.
        self._hang: tuple[int, float] | None = None
        self._stuck: float | None = None
        self._held: _Step | None = None  # the step a hang or stuck collective holds up
        # Ranks whose GPU is lost, and whether its XID was written yet (once, as NVML's event).
        self._lost: dict[int, bool] = {}
        self._entered = [0] * profile.ranks  # the last seq each rank's rows reported
        self._last_enter: list[float | None] = [None] * profile.ranks
        self._asked = [start] * profile.ranks  # the end of each rank's last interval
        # The launch queue's depth in seconds of a rank's own work.
        rate = self.shape.launch_rate or 1.0
        self.queue_s = QUEUE_LAUNCHES / rate
        positions = profile.collectives
        self.at = [
            FIRST_AT + (LAST_AT - FIRST_AT) * (j / (positions - 1) if positions > 1 else 0.0)
            for j in range(positions)
        ]

    # ---- controls -------------------------------------------------------------------

    def set_slowdown(
        self, rank: int, slowdown: float, cause: str | None = None, at: float | None = None
    ) -> None:
        """Rank ``rank`` runs ``slowdown`` slower (0: at full speed) from ``at``: the rest of
        its share of the step in progress then, and every later step (None: from its next
        step)."""
        if not 0 <= slowdown < 1:
            raise ValueError(f"slowdown must be in [0, 1), got {slowdown!r}")
        if cause is not None and cause not in LOCKSTEP_CAUSES:
            raise ValueError(f"cause must be one of {', '.join(LOCKSTEP_CAUSES)}, got {cause!r}")
        self._check_rank(rank)
        new = RankSlowdown(slowdown, cause if slowdown > 0 else None)
        self.slow[rank] = new
        if at is None:
            return
        self._advance(at)
        step = self.steps[-1] if self.steps else None
        if step is None or step.end == math.inf or not step.start <= at < step.host_end[rank]:
            return
        stretch = new.factor / step.slow[rank].factor
        host_ahead = new.cause in _GPU_CAUSES and self.shape.launch_ns <= LAUNCH_HOST_NS
        arrivals = step.arrivals[rank]
        for j, a in enumerate(arrivals):
            if a > at and not host_ahead:
                arrivals[j] = at + (a - at) * stretch
        step.host_end[rank] = at + (step.host_end[rank] - at) * stretch
        step.spans[rank] = [(a, min(b, at)) for a, b in step.spans[rank] if a < at]
        step.spans[rank].append((at, step.host_end[rank]))
        step.work[rank] = sum(b - a for a, b in step.spans[rank])
        step.slow[rank] = new
        step.end = max(step.host_end)

    def phase(self, slowdown: float) -> None:
        """Every rank ``slowdown`` slower from the next step (0: back to the first phase)."""
        if not 0 <= slowdown < 1:
            raise ValueError(f"slowdown must be in [0, 1), got {slowdown!r}")
        self.phase_factor = 1.0 / (1.0 - slowdown)

    def hang(self, rank: int, at: float) -> None:
        """Rank ``rank`` stops right before the first collective it would enter after ``at``."""
        self._check_rank(rank)
        self._hold_current(at, (rank, at), None)

    def lose_gpu(self, rank: int) -> None:
        """Rank ``rank``'s GPU falls off the bus (XID 79) from its next interval: its NVML
        rows say lost (a hang on it: :meth:`hang`); :meth:`release` does not bring it back."""
        self._check_rank(rank)
        self._lost.setdefault(rank, False)

    def stuck(self, at: float) -> None:
        """The collective in flight at ``at`` never completes: every rank waits in it."""
        self._hold_current(at, None, at)

    def release(self, at: float) -> None:
        """A hang or stuck collective ends at ``at``: the job goes on from there."""
        step = self._held
        self._hang = self._stuck = None
        self._held = None
        if step is None:
            return
        n = self.profile.ranks
        for r in range(n):
            arrivals = step.arrivals[r]
            stopped = step.spans[r][-1][1] if step.spans[r] else step.start
            left = step.work[r]
            done = sum(b - a for a, b in step.spans[r])
            rest = max(0.0, left - done)
            resume = max(at, stopped)
            # What it had not entered, it enters after the resumption, at the same pace.
            for j, a in enumerate(arrivals):
                if a == math.inf or a > stopped:
                    share = self.at[j] * step.work[r] - _worked_before(step.spans[r], a)
                    arrivals[j] = resume + max(0.0, share)
            if rest > 0:
                step.spans[r].append((resume, resume + rest))
            step.host_end[r] = resume + rest
        step.end = max(step.host_end)

    # ---- rows -----------------------------------------------------------------------

    def rows(self, rank: int, ts_start: float, ts_end: float) -> RankRows:
        """Rank ``rank``'s rows for the interval ``(ts_start, ts_end]``."""
        self._check_rank(rank)
        if ts_end <= ts_start:
            raise ValueError("an interval must end after it starts")
        self._advance(ts_end)
        self._asked[rank] = max(self._asked[rank], ts_end)
        dt = ts_end - ts_start
        worked = spinning = launched = 0.0
        syncs = 0
        sync_ns = 0.0
        calls: list[tuple[float, int]] = []
        slow = self.slow[rank]
        stopped_at: float | None = None
        for step in self.steps:
            if step.start >= ts_end or step.end <= ts_start:
                continue
            spans = step.spans[rank]
            slow = step.slow[rank]
            inside = sum(_overlap(a, b, ts_start, ts_end) for a, b in spans)
            worked += inside
            # Launches spread over its own work (the step's launches at full speed).
            launched += inside * self.profile.step_s / step.work[rank]
            # Waiting (its GPU spinning in NCCL) from its work's end to the step's end.
            end = step.end
            host_end = step.host_end[rank]
            if step.end == math.inf:
                stop = spans[-1][1] if spans else step.start
                stopped_at = stop
                if not self._missing(rank, step):
                    spinning += _overlap(stop, math.inf, ts_start, ts_end)
            else:
                spinning += _overlap(host_end, end, ts_start, ts_end)
                if ts_start < end <= ts_end:
                    syncs += 1
                    lead = self.shape.sync_ns * self._effect(slow).gpu_wait
                    sync_ns += lead + (end - host_end) * 1e9
            for j, a in enumerate(step.arrivals[rank]):
                seq = step.index * self.profile.collectives + j + 1
                if ts_start < a <= ts_end:
                    calls.append((a, seq))
                if a <= ts_end and seq > self._entered[rank]:
                    # The timeline's, not only this interval's: a rank whose rows start late
                    # has entered what its peers have.
                    self._entered[rank], self._last_enter[rank] = seq, a
        rows = self._generator_rows(
            rank, ts_start, ts_end, slow, launched / dt, worked / dt, spinning / dt, syncs,
            sync_ns, stopped_at,
        )  # fmt: skip
        self._nccl_rows(rank, ts_end, sorted(calls), rows)
        if rank in self._lost:
            self._lost_gpu_rows(rank, ts_start, ts_end, rows)
        self._prune()
        return rows

    def _lost_gpu_rows(self, rank: int, ts_start: float, ts_end: float, rows: RankRows) -> None:
        """The rank's GPU rows once it is lost: NVML answers GPU_IS_LOST and nothing else
        (the reading ends there), the XID watched, 79 in the first interval only."""
        xids: tuple[int, ...] = () if self._lost[rank] else (XID_FALLEN_OFF_BUS,)
        self._lost[rank] = True
        gpus = sorted({int(row["gpu"]) for row in rows.gpu_intervals}) or [0]
        reading = NvmlReading(gpus=tuple(GpuReading(g, lost=True, xids=xids) for g in gpus))
        lost = reading_rows(reading, ts_start, ts_end)
        rows.gpu_intervals, rows.gpu_processes = lost.intervals, lost.processes

    def _generator_rows(
        self,
        rank: int,
        ts_start: float,
        ts_end: float,
        slow: RankSlowdown,
        speed: float,
        worked: float,
        spinning: float,
        syncs: int,
        sync_ns: float,
        stopped_at: float | None,
    ) -> RankRows:
        """The rank's generator rows: its launches at ``speed`` of full speed, its slow
        cause's marks, its GPU busy while working or spinning, idle once it has hung."""
        missing = stopped_at is not None and self._missing(rank, self._held)
        hung = missing and stopped_at is not None and stopped_at <= ts_start
        effect = CauseEffect(offcpu_s=0.0) if hung else self._effect(slow)
        # A host-slow rank's GPU waits for its host; any other GPU is busy, computing or
        # spinning in NCCL's kernel while its host waits. A hung rank's drains and idles.
        busy = 1.0 - slow.slowdown if (slow.slowdown > 0 and effect.host_waits) else 1.0
        if missing and stopped_at is not None:
            lead = self.queue_s if self.shape.launch_ns > LAUNCH_HOST_NS else 0.0
            busy *= min(1.0, max(0.0, stopped_at + lead - ts_start) / (ts_end - ts_start))
        power = min(1.0, worked + SPIN_POWER * spinning)
        activity = Activity(
            speed=min(speed, 2.0),
            effect=effect,
            stalled=hung,
            gpu_speed=busy,
            clock_speed=1.0 - slow.slowdown if effect.throttled else 1.0,
            power_speed=power,
            syncs=(SYNC_OP, syncs, sync_ns),
        )
        base = self.gens[rank].interval(ts_start, ts_end, activity)
        return RankRows(**base.__dict__)

    def _effect(self, slow: RankSlowdown) -> CauseEffect:
        """What the rank's slowdown adds to its rows: its cause's marks (none when at speed)."""
        if slow.slowdown <= 0:
            return CauseEffect(offcpu_s=0.0)
        if slow.cause == GPU_SILENT:
            # Slower with nothing in NVML: only the calls that wait for it wait longer.
            return CauseEffect(host_waits=False, gpu_wait=slow.factor)
        return cause_effect(slow.cause, slow.slowdown, self.shape)

    def _nccl_rows(
        self, rank: int, ts_end: float, calls: list[tuple[float, int]], rows: RankRows
    ) -> None:
        p = self.profile
        tags = {
            "pid": p.pid if p.same_pid else p.pid + rank,
            "job_id": p.job_id,
            "rank": rank,
            "comm_hash": self.comm_hash,
            "comm_rank": rank,
            "nranks": p.ranks,
        }
        for at, seq in calls:
            rows.nccl_calls.append(
                {**tags, "ts_enter": at, "ts_return": at + ENQUEUE_NS / 1e9,
                 "tid": tags["pid"], "seq": seq, "op": COLLECTIVE_OP,
                 "bytes": BUCKET_BYTES, "ret": 0}
            )  # fmt: skip
        entered = self._entered[rank]
        rows.nccl_comms.append(
            {**tags, "ts": ts_end, "calls": len(calls), "entered_seq": entered,
             "returned_seq": entered, "last_enter_ts": self._last_enter[rank],
             "inflight_seq": None, "inflight_op": None, "inflight_since": None,
             "wait_ns": len(calls) * ENQUEUE_NS, "sampled": len(calls), "dropped": 0}
        )  # fmt: skip

    # ---- the timeline ---------------------------------------------------------------

    def _advance(self, until: float) -> None:
        """Every step that begins before ``until``."""
        while True:
            last = self.steps[-1] if self.steps else None
            begin = self.start if last is None else last.end
            if begin >= until or begin == math.inf:
                return
            self.steps.append(self._step(0 if last is None else last.index + 1, begin))

    def _step(self, index: int, start: float) -> _Step:
        p, rng = self.profile, self.rng
        n = p.ranks
        shared = max(0.5, rng.gauss(1.0, p.job_noise)) * self.phase_factor * p.step_s
        slow = list(self.slow)
        work = [shared * slow[r].factor * max(0.8, rng.gauss(1.0, STEP_NOISE)) for r in range(n)]
        arrivals: list[list[float]] = []
        # Where the host runs ahead of its GPU (a launch queue that never fills), a slow GPU
        # leaves the host's arrivals on time.
        queue_full = self.shape.launch_ns > LAUNCH_HOST_NS
        for r in range(n):
            pace = work[r]
            if slow[r].cause in _GPU_CAUSES and not queue_full:
                pace = work[r] / slow[r].factor
            arrivals.append(
                [start + f * pace + abs(rng.gauss(0.0, ARRIVAL_JITTER_S)) for f in self.at]
            )
        step = _Step(
            index=index,
            start=start,
            end=start + max(work),
            arrivals=arrivals,
            host_end=[start + w for w in work],
            spans=[[(start, start + w)] for w in work],
            work=work,
            slow=slow,
        )
        if (self._hang is not None or self._stuck is not None) and self._held is None:
            self._hold(step, -math.inf)
        return step

    def _hold_current(self, at: float, hang: tuple[int, float] | None, stuck: float | None) -> None:
        """A hang or stuck collective from ``at``: in the step in progress if a collective of
        it is still to come, else in the next one (``_step`` holds that)."""
        if self._held is not None:
            raise ValueError("the job is held already: release it first")
        self._advance(at)  # the steps before ``at`` as they were
        self._hang, self._stuck = hang, stuck
        step = self.steps[-1] if self.steps else None
        if step is not None and step.end > at:
            self._hold(step, at)

    def _hold(self, step: _Step, after: float) -> None:
        """Hold ``step`` at its first collective after ``after`` (see the module docstring);
        a step with none left is left alone (the next one is held)."""
        n = self.profile.ranks
        if self._hang is not None:
            rank = self._hang[0]
            later = [j for j, a in enumerate(step.arrivals[rank]) if a > after]
        else:
            # The collective in flight: the first some rank has not entered yet.
            later = [
                j
                for j in range(self.profile.collectives)
                if max(step.arrivals[r][j] for r in range(n)) > after
            ]
        if not later:
            return
        held = later[0]
        # The launch queue holds this share of a step's launches: past the held collective,
        # every rank (the same program) enqueues the collectives within it, then blocks.
        reach = self.at[held] + self.queue_s / self.profile.step_s
        for r in range(n):
            arrivals = step.arrivals[r]
            missing = self._hang is not None and r == self._hang[0]
            if missing:
                stop = arrivals[held]
            else:
                stop = arrivals[held] + (min(reach, 1.0) - self.at[held]) * step.work[r]
                stop = min(stop, step.host_end[r])
            for j in range(self.profile.collectives):
                if (missing and j >= held) or (not missing and j > held and self.at[j] > reach):
                    arrivals[j] = math.inf
                elif not missing and j >= held:
                    stop = max(stop, arrivals[j])
            step.spans[r] = [(a, min(b, stop)) for a, b in step.spans[r] if a < stop]
        step.end = math.inf
        self._held = step

    def _missing(self, rank: int, step: _Step | None) -> bool:
        """Whether ``rank`` is the one a held step waits for (it never entered its collective)."""
        return (
            step is not None
            and self._hang is not None
            and self._hang[0] == rank
            and any(a == math.inf for a in step.arrivals[rank])
        )

    def _prune(self) -> None:
        """Forget the steps every rank's rows have passed (a long run stays small)."""
        oldest = min(self._asked)
        while len(self.steps) > 1 and self.steps[0].end < oldest:
            self.steps.pop(0)

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.profile.ranks:
            raise ValueError(f"rank must be in [0, {self.profile.ranks - 1}], got {rank}")

    def with_profile(self, **changes: Any) -> JobProfile:
        return replace(self.profile, **changes)


def _overlap(a: float, b: float, lo: float, hi: float) -> float:
    return max(0.0, min(b, hi) - max(a, lo))


def _worked_before(spans: list[tuple[float, float]], at: float) -> float:
    return sum(max(0.0, min(b, at) - a) for a, b in spans if a < at)
