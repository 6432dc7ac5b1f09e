"""One health sample of this node: read the collectors, advance the state, score, learn.

The thin I/O shell around the pure score, baseline and state logic; the push agent calls
``NodeSampler.sample()`` once per push interval.

Each sample judges the tracer intervals written since the last one
(``ingero.nodedb.window.read_latest``), not the wall-clock time since the last push.
Where the tracer wrote nothing new the sample holds: the node keeps its state and pushes its
last measurement again (``held``), logged once; silent past ``score.stale_after`` (and 3 of
its own intervals) the node is ``stale``. A node whose job runs but launches nothing is held
too until the quiet intervals make a stall (``ingero.push.nodestate``).
"""

from __future__ import annotations

import logging
import os
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from ingero.collectors.gpu import GpuQuery, GpuStatus, NoGpu
from ingero.collectors.procfs import ProcfsError, ProcReader
from ingero.nodedb.window import NodeDbUnavailable, WindowAggregates, read_latest
from ingero.otlp.collectives import CommReport
from ingero.otlp.health import (
    GRAPH_LAUNCH_RATE,
    INFERENCE_STEP_RATE,
    INFERENCE_TOKEN_RATE,
    KERNEL_LAUNCH_RATE,
    STEP_RATE,
    THROUGHPUT_RATES,
    NodeState,
)
from ingero.push.baseline import BaselineSet, BaselineStore, EmaBaseline
from ingero.push.collectives import CollectivesReader
from ingero.push.config import NcclConfig
from ingero.push.engines import EngineWatcher
from ingero.push.gpu_health import GpuFinding, GpuHealth, GpuHealthTracker
from ingero.push.nodestate import NodeStateMachine, Transition
from ingero.push.score import ScoreConfig, ScoreInputs, ScoreResult, compute_score
from ingero.push.servers import ServerBaselines, ServerStep, measure, metered, slowest
from ingero.push.waiting import FleetNccl, lockstep, waiting_words, with_peers
from ingero.runtime.clock import Clock

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeSample:
    timestamp: float
    state: NodeState
    result: ScoreResult | None  # None while stale: there is nothing to score
    window: WindowAggregates | None
    transition: Transition | None
    stale_reason: str | None = None
    gpu_error: str | None = None
    gpu_health: GpuHealth | None = None
    gpu_findings: tuple[GpuFinding, ...] = ()  # new GPU problems, to be raised as events
    # Active, the job still runs, but no kernel launches: a straggler while peers go on.
    stalled: bool = False
    # Whether this node's job runs (its processes, else its job file); None: nothing tells.
    job_running: bool | None = None
    # The peer rate the throughput signal was measured against, None: the own baseline.
    peer_rate: str | None = None
    # The node's NCCL communicators this interval (ingero.push.collectives).
    collectives: tuple[CommReport, ...] = ()
    # Nothing new was measured (no new tracer interval, or quiet but not yet a stall): the
    # sample repeats the last measurement and is not classified again.
    held: bool = False
    # The inference server the throughput signal judged (the slowest of the node's servers
    # by their decode steps or /metrics token rate, ingero.push.servers); None: the node's
    # rate was judged.
    slowest_server: ServerStep | None = None
    # Quiet: no kernel launch in the new intervals while the job runs (stalled, waiting,
    # or not yet either). Waiting: quiet because a rank of it waits at a collective;
    # ``waiting_for`` is Fleet's word of whom for (None: a call still in flight).
    quiet: bool = False
    waiting: bool = False
    waiting_for: Mapping[str, Any] | None = None

    @property
    def score(self) -> float:
        return self.result.score if self.result is not None else 0.0


class _GpuReading(NamedTuple):
    """What one window says of the node's GPUs."""

    busy: float | None  # mean busy fraction (None: not measured)
    error: str | None  # why a live query failed
    health: GpuHealth
    fault: bool  # a GPU in error (an XID, ECC errors, lost)


class _Throughput(NamedTuple):
    """The throughput signal of one window and what it is judged against."""

    rate: float | None  # None: not judged (no rate, or a lock-step job)
    reference: float | None  # the peers' median, else the own (or the server's) baseline
    peer_rate: str | None  # the peer rate it was measured against; None: the own baseline
    worst: ServerStep | None  # the slowest inference server, where it judged the node
    own_baseline: float | None  # the own baseline of the rate judged without peers


class NodeSampler:
    """Keeps the node's state machine and baselines across samples."""

    def __init__(
        self,
        *,
        node_id: str,
        db_path: Path,
        config: ScoreConfig,
        window_s: float,
        clock: Clock,
        baseline_path: Path | None = None,
        proc: ProcReader | None = None,
        gpu: GpuQuery | None = None,
        pid_alive: Callable[[int], bool] | None = None,
        collectives: NcclConfig | None = None,
        engines: EngineWatcher | None = None,
    ) -> None:
        """``engines``: the node's inference servers, measured each sample (None: none
        looked for). ``pid_alive`` tells whether a traced process still exists (default: this host's
        process table); the benchmark's simulated processes inject their own.
        ``collectives``: read the node DB's NCCL tables too (None: not at all)."""
        config.validate()
        self.pid_alive = pid_alive or _pid_alive
        self.engines = engines
        self.collectives = (
            CollectivesReader(
                db_path,
                interval_s=window_s,
                recent_intervals=collectives.recent_intervals,
                max_calls_read=collectives.max_calls_read,
                pid_alive=self.pid_alive,
            )
            if collectives is not None and collectives.enabled
            else None
        )
        # The processes that launched kernels or graphs in the last window with launches.
        self.traced_pids: tuple[int, ...] = ()
        # Whether this node's job has replayed CUDA graphs (its graph launch rate is then
        # measured, and 0 while it stalls).
        self.graphs = False
        self.config = config
        self.db_path = db_path
        self.window_s = window_s
        self.clock = clock
        self.proc = proc or ProcReader(Path(config.proc_root))
        self.gpu = gpu or NoGpu()
        self.health = GpuHealthTracker(config.gpu_health)
        self.store = (
            BaselineStore(
                baseline_path,
                node_id=node_id,
                clock=clock,
                alpha=config.ema_alpha,
                alpha_down=config.ema_alpha_down,
            )
            if baseline_path is not None
            else None
        )
        loaded = self.store.load() if self.store is not None else None
        if loaded is not None and loaded.baselines is not None:
            self.baselines = loaded.baselines
            log.info(
                "baselines restored from %s (%d samples)", baseline_path, self.baselines.samples
            )
        else:
            now = clock.now()
            self.baselines = BaselineSet(node_id=node_id, created=now, updated=now)
        self.restore_reason = loaded.reason if loaded is not None else None
        # Each inference server's steps from the tracer (its decode stream's, else its
        # syncs), the steps its /metrics time, and its /metrics token rate, each against its
        # own baseline (in memory). The /metrics steps have baselines apart from the
        # tracer's: an interval without a /metrics reading falls back to the tracer, and
        # one baseline for both would start again at each change of source.
        self.servers, self.timed_servers, self.token_servers = (
            ServerBaselines(
                alpha=config.ema_alpha,
                alpha_down=config.ema_alpha_down,
                warmup=config.warmup_samples,
            )
            for _ in range(3)
        )
        self.state = NodeStateMachine(
            warmup_samples=config.warmup_samples,
            idle_after=config.idle_after,
            clock=clock,
            warm_samples=self.baselines.samples,
            stall_intervals=config.stall_intervals,
            stall_after=float(config.stall_after),
            wait_samples=config.collective_wait_samples,
        )
        # The newest tracer interval end sampled so far (the next window's new rows end
        # later), the length of the tracer's intervals, and the last measurement (a held
        # sample repeats it).
        self.anchor: float | None = None
        self.tracer_interval = 0.0
        self.started = clock.now()
        self.last: NodeSample | None = None
        # Why samples were held so far: each reason is logged once (at a 1 s push interval
        # a tracer a few ms late holds a sample a minute, which is no news after the first).
        self.held_for: set[str] = set()

    def sample(
        self,
        peer_rates: Mapping[str, float] | None = None,
        job_file: bool = False,
        *,
        straggling: bool = False,
        job_id: str | None = None,
        nccl: FleetNccl | None = None,
    ) -> NodeSample:
        """One sample. ``peer_rates``: Fleet's fresh peer medians of the raw rates (the node's
        throughput is then measured against them); ``job_file``: the prolog's job file for
        this node is present; ``straggling``: the node is in a straggler episode (its
        baselines then hold still); ``job_id``: the job pushed, whose marked steps alone
        are the node's steps (None: every writer's); ``nccl``: what Fleet's last fresh
        reply said of its NCCL ranks (ingero.push.waiting)."""
        now = self.clock.now()
        try:
            window = read_latest(self.db_path, now, self.window_s, self.anchor, job_id=job_id)
        except NodeDbUnavailable as exc:
            transition = self.state.observe(readable=False)
            return NodeSample(now, self.state.state, None, None, transition, stale_reason=str(exc))

        cpu_busy: float | None = None
        host_mem_free: float | None = None
        try:
            cpu_busy = self.proc.cpu_busy_fraction()
        except ProcfsError as exc:
            log.warning("%s", exc)
        try:
            host_mem_free = self.proc.meminfo().available_fraction
        except ProcfsError as exc:
            log.warning("%s", exc)
        comms = self.collectives.read(now) if self.collectives is not None else ()
        waiting = any(c.inflight_seq is not None for c in comms)
        inference = self.engines.observe() if self.engines is not None else None
        sample = self.evaluate(
            window,
            now,
            cpu_busy,
            host_mem_free,
            peer_rates,
            job_file,
            waiting=waiting,
            inference=inference,
            straggling=straggling,
            nccl=nccl,
            at_collective=with_peers(comms),
            lockstep=lockstep(comms),
        )
        return replace(sample, collectives=comms) if comms else sample

    def evaluate(
        self,
        window: WindowAggregates,
        now: float,
        cpu_busy: float | None,
        host_mem_free: float | None,
        peer_rates: Mapping[str, float] | None = None,
        job_file: bool = False,
        *,
        waiting: bool = False,
        inference: Mapping[str, float] | None = None,
        straggling: bool = False,
        nccl: FleetNccl | None = None,
        at_collective: bool = False,
        lockstep: bool = False,
    ) -> NodeSample:
        """Score one window read from the node DB, with the host's CPU and memory readings;
        advances the state machine, the baselines and the GPU health state (the benchmark
        drives this directly with generated windows). ``waiting``: a rank of the node is
        inside an NCCL collective (ingero.push.nodestate: waiting is not stalled).
        ``inference``: the node's inference servers' speeds this interval (their /metrics).
        ``straggling``: the node is in a straggler episode; it learns no baseline then.
        ``nccl``: Fleet's word of the node's NCCL ranks (they wait for others, or others
        for them); ``at_collective``: a rank of the node is in a communicator with peers;
        ``lockstep``: with ranks on other nodes, which pace its own (ingero.push.waiting:
        its quiet waits for Fleet's word, its throughput is not judged)."""
        if window.new_intervals == 0:
            return self._no_data(window, now, job_file)
        self.anchor = window.end
        self.tracer_interval = window.new_covered_s / window.new_intervals
        gpu = self._gpu_reading(window, now)
        self.graphs = self.graphs or window.graph_launch_rate is not None
        # Work is judged on the new intervals; the rate over the whole window (which may
        # reach back over rows the last sample saw, where the tracer's cadence is finer).
        has_work = window.new_launches > 0
        running = None if has_work else self._job_running(window, job_file)
        if has_work:
            self.traced_pids = window.launch_pids
        was_stalled = self.state.stalled
        transition = self._observe(window, running, waiting, at_collective, nccl, gpu.fault)
        held = self._hold_if_quiet(now, window, transition, running, at_collective, nccl)
        if held is not None:
            return held
        stalled = self.state.stalled
        if stalled != was_stalled:
            log.warning(
                "%s",
                "stalled: the job runs but launches nothing"
                if stalled
                else "launching again"
                if has_work
                else "no longer stalled: the job has ended",
            )
        own = self._own_rates(window, stalled, has_work)
        timed, steps, served = self._server_rates(window, inference, stalled, own)
        per_server = {INFERENCE_STEP_RATE: steps, INFERENCE_TOKEN_RATE: served}
        signal = self._throughput(own, per_server, peer_rates, lockstep and not stalled)
        result = self._score(signal, own, gpu, host_mem_free, cpu_busy)
        if has_work and self.state.state in ("calibrating", "active") and not straggling:
            self._learn_window(window, own, gpu.busy, timed, steps, served)
        self.last = NodeSample(
            now,
            self.state.state,
            result,
            window,
            transition,
            gpu_error=gpu.error,
            gpu_health=gpu.health,
            gpu_findings=gpu.health.findings,
            stalled=stalled,
            job_running=running,
            peer_rate=signal.peer_rate if signal.rate is not None else None,
            slowest_server=signal.worst,
            quiet=self.state.quiet,
        )
        return self.last

    def _gpu_reading(self, window: WindowAggregates, now: float) -> _GpuReading:
        """The GPUs' busy fraction and health this window, and whether one is in error."""
        # GPU rows in the node DB (NVML through ingero trace or gpu-sample) first; a live
        # query only where nothing writes them. Busy is measured or missing, never estimated.
        error = None
        busy = window.gpu_busy_fraction
        if not window.gpus:
            status = self.gpu.query()
            error = status.error
            busy = _utilization(status)
        health = self.health.observe(window.gpus, now)
        error_factor = 1.0 - self.config.gpu_health.error_penalty
        fault = health.value is not None and health.value <= error_factor < 1.0
        return _GpuReading(busy, error, health, fault)

    def _observe(
        self,
        window: WindowAggregates,
        running: bool | None,
        waiting: bool,
        at_collective: bool,
        nccl: FleetNccl | None,
        gpu_fault: bool,
    ) -> Transition | None:
        """Advance the state machine by the new intervals' launches and the node's waits."""
        return self.state.observe(
            readable=True,
            kernel_launches=window.new_launches,
            job_running=running,
            waiting=waiting,
            intervals=window.new_intervals,
            covered_s=window.new_covered_s,
            # A GPU in error (an XID, ECC errors, lost) is a quiet of the node's own, whatever
            # its rank's peers do: the others may well be waiting for it.
            at_collective=at_collective and not gpu_fault,
            fleet_wait=nccl is not None and nccl.waiting_for is not None and not gpu_fault,
            waited_for=nccl is not None and nccl.waited_for,
        )

    def _hold_if_quiet(
        self,
        now: float,
        window: WindowAggregates,
        transition: Transition | None,
        running: bool | None,
        at_collective: bool,
        nccl: FleetNccl | None,
    ) -> NodeSample | None:
        """The held sample of a node quiet at a collective or short of a stall, else None."""
        waiting_for = nccl.waiting_for if nccl is not None else None
        if self.state.waiting:
            if not (self.last is not None and self.last.waiting):
                log.warning(
                    "%s",
                    "waiting "
                    + (waiting_words(waiting_for) if waiting_for else "inside a collective")
                    + ": quiet, not stalled",
                )
            return self._hold(
                now, window, transition, "quiet: waiting at a collective", running, waiting_for
            )
        if self.state.pending:
            return self._hold(
                now,
                window,
                transition,
                "quiet: no kernel launches, not yet long enough for a stall"
                if not at_collective
                else "quiet at a collective: waiting for Fleet's view of its communicator",
                running,
            )
        return None

    def _own_rates(
        self, window: WindowAggregates, stalled: bool, has_work: bool
    ) -> dict[str, float | None]:
        """The node's launch and step rates this window (a stalled node's are 0)."""
        # Launch counts are fine-grained; whole steps per window are too coarse to compare.
        # A stalled node's job runs: its launch rate is measured, and it is 0.
        launch_rate = window.kernel_launch_rate
        return {
            KERNEL_LAUNCH_RATE: 0.0 if stalled else launch_rate if has_work else None,
            STEP_RATE: 0.0 if stalled else window.step_rate,
            GRAPH_LAUNCH_RATE: (0.0 if self.graphs else None)
            if stalled
            else window.graph_launch_rate,
        }

    def _server_rates(
        self,
        window: WindowAggregates,
        inference: Mapping[str, float] | None,
        stalled: bool,
        own: dict[str, float | None],
    ) -> tuple[bool, tuple[ServerStep, ...], tuple[ServerStep, ...]]:
        """Judge each inference server's steps and tokens; the node's inference rates to ``own``."""
        # Returns (the servers' /metrics timed their steps, the steps, the token rates).
        # The servers' /metrics time their steps (else the tracer does, below).
        timed = INFERENCE_STEP_RATE in (inference or {})
        inference, steps = self._server_steps(window, inference, timed)
        served: tuple[ServerStep, ...] = ()
        if self.engines is not None and INFERENCE_TOKEN_RATE in (inference or {}):
            served = self.token_servers.judge(
                metered({pid: r.token_rate for pid, r in self.engines.rates.items()})
            )
        if stalled:
            steps, served = (), ()
        for name in (INFERENCE_TOKEN_RATE, INFERENCE_STEP_RATE):
            # A server that served nothing this interval says nothing (not 0: no load is
            # not slowness); a stalled node is judged by its launches.
            own[name] = None if stalled else (inference or {}).get(name)
        return timed, steps, served

    def _throughput(
        self,
        own: dict[str, float | None],
        per_server: Mapping[str, tuple[ServerStep, ...]],
        peer_rates: Mapping[str, float] | None,
        lockstep: bool,
    ) -> _Throughput:
        """The throughput signal and its reference: the peers' median, else the own baseline."""
        baselines = self.baselines.baselines
        # Without a peer median, the node's own rate against its own baseline: its
        # inference servers' speed where they say it, its graph launches where it replays
        # graphs (kernel launches outside them may be few or none), else its kernel launches.
        local = next(
            (
                name
                for name in (INFERENCE_TOKEN_RATE, INFERENCE_STEP_RATE, GRAPH_LAUNCH_RATE)
                if own[name] is not None and name in baselines
            ),
            KERNEL_LAUNCH_RATE,
        )
        launch_base = baselines.get(local)
        # Throughput against the peers' median where Fleet has one (a node slow from its
        # first minute learns its slow rate as its own baseline), else the own baseline.
        peer_rate = next(
            (
                name
                for name in THROUGHPUT_RATES
                if own.get(name) is not None and (peer_rates or {}).get(name, 0.0) > 0
            ),
            None,
        )
        throughput: float | None
        reference: float | None
        # A node's inference servers are replicas: the node is as slow as its slowest one,
        # which the median it pushes would hide (ingero.push.servers).
        worst: ServerStep | None = None
        if peer_rate is not None and peer_rates is not None:
            throughput, reference = own[peer_rate], peer_rates[peer_rate]
            worst = slowest(per_server.get(peer_rate, ()), by_rate=True)
            if worst is not None:
                throughput = worst.rate
        else:
            throughput = own[local]
            reference = launch_base.estimate if launch_base is not None else None
            worst = slowest(per_server.get(local, ()))
            if worst is not None:
                throughput, reference = worst.rate, worst.baseline
        if lockstep:
            # Every rank of a lock-step job has the job's rate: a peer ratio names no rank,
            # and a peer median a tick older than the node's rate makes every rank look slow
            # when the job slows. Its arrivals (Fleet's peer_lag), GPU health and stalls
            # judge it (ingero.push.waiting).
            throughput = None
        own_base = launch_base.estimate if launch_base else None
        return _Throughput(throughput, reference, peer_rate, worst, own_base)

    def _score(
        self,
        signal: _Throughput,
        own: dict[str, float | None],
        gpu: _GpuReading,
        host_mem_free: float | None,
        cpu_busy: float | None,
    ) -> ScoreResult:
        """The score of the window's signals, with the rates it was judged on."""
        busy_base = self.baselines.baselines.get("gpu_busy_fraction")
        worst = signal.worst
        # The memory signal is the host's. A GPU's memory is full by design wherever the
        # job is big: PyTorch's caching allocator keeps what it reserved (an LLM training
        # job holds 90-98% of an H100), an inference engine takes a set share at start
        # (vLLM's gpu_memory_utilization, 0.9). Scored, it pulled a healthy node with 76
        # GiB of 80 used to 0.43 and hid a 10% slowdown in 10 of 10 runs
        # (docs/decisions/0041-memory-signal-host.md); GPU memory pressure shows where it
        # hurts, as allocator retries that slow the work the throughput signal measures.
        return compute_score(
            ScoreInputs(
                throughput_rate=signal.rate,
                throughput_baseline=signal.reference,
                gpu_busy_fraction=gpu.busy,
                gpu_busy_baseline=busy_base.estimate if busy_base is not None else None,
                mem_free_fraction=host_mem_free,
                cpu_busy_fraction=cpu_busy,
                gpu_health=gpu.health.value,
                rates={
                    **own,
                    "throughput_baseline": signal.own_baseline,
                    "throughput_peer_median": signal.reference if signal.peer_rate else None,
                    "slowest_server_rate": worst.rate if worst else None,
                    "slowest_server_baseline": worst.baseline if worst else None,
                },
            ),
            self.config,
        )

    def _learn_window(
        self,
        window: WindowAggregates,
        own: dict[str, float | None],
        busy: float | None,
        timed: bool,
        steps: tuple[ServerStep, ...],
        served: tuple[ServerStep, ...],
    ) -> None:
        """Learn a measured window's rates as the node's normal, and each server's."""
        # A straggler's samples are not its normal (the caller learns none then): learnt
        # (even at ema_alpha_down per sample) they lift its score back to the threshold
        # within a minute at a 1 s push and the episode flaps while the node is as slow as
        # ever (docs/decisions/0042-straggler-learns-no-baseline.md).
        launch_rate = window.kernel_launch_rate
        if launch_rate is None:
            return
        self._learn(
            {
                KERNEL_LAUNCH_RATE: launch_rate,
                GRAPH_LAUNCH_RATE: window.graph_launch_rate,
                INFERENCE_TOKEN_RATE: own[INFERENCE_TOKEN_RATE],
                INFERENCE_STEP_RATE: own[INFERENCE_STEP_RATE],
                "gpu_busy_fraction": busy,
            }
        )
        (self.timed_servers if timed else self.servers).learn(steps)
        self.token_servers.learn(served)

    def _server_steps(
        self, window: WindowAggregates, inference: Mapping[str, float] | None, timed: bool
    ) -> tuple[Mapping[str, float] | None, tuple[ServerStep, ...]]:
        """Each server's steps, judged against its own baseline: where the servers'
        /metrics time their steps (TGI, Triton), those (the node's rate is already their
        median); else from the tracer (``ingero.push.servers.measure``: of the server and
        its workers, the decode stream's decode steps, else their synchronize calls per
        second), and the node's rate is the median over its servers that stepped.
        ``timed``: the servers' /metrics time their steps this interval."""
        if self.engines is None:
            return inference, ()
        for baselines in (self.servers, self.timed_servers, self.token_servers):
            baselines.prune(self.engines.summary())
        if timed:
            rates = {pid: r.step_rate for pid, r in self.engines.rates.items()}
            return inference, self.timed_servers.judge(metered(rates))
        if not window.syncs or window.covered_s <= 0:
            return inference, ()
        found = measure(
            window.streams, window.syncs, window.covered_s, self.engines.trees(),
            self.servers.streams(),
        )  # fmt: skip
        steps = self.servers.judge(found)
        if not steps:
            return inference, ()
        rate = statistics.median(s.rate for s in steps)
        return {**(inference or {}), INFERENCE_STEP_RATE: rate}, steps

    def _no_data(self, window: WindowAggregates, now: float, job_file: bool) -> NodeSample:
        """No tracer interval since the last sample: hold, unless the job has ended (idle)
        or the tracer has been silent past the stale bound."""
        running = self._job_running(window, job_file)
        last = window.latest_end if window.latest_end is not None else self.anchor
        silent = now - (last if last is not None else self.started)
        bound = max(float(self.config.stale_after), 3 * self.tracer_interval)
        if running is not False and silent > bound:
            reason = f"the tracer wrote nothing for {silent:.0f} s"
            transition = self.state.observe(readable=False, reason=reason)
            return NodeSample(now, self.state.state, None, window, transition, stale_reason=reason)
        transition = self.state.observe(readable=True, job_running=running, intervals=0)
        if transition is not None:  # the job has ended: idle, nothing held
            sample = NodeSample(
                now, self.state.state, self.last.result if self.last else None, window,
                transition, job_running=running,
            )  # fmt: skip
            self.last = sample
            return sample
        return self._hold(
            now,
            window,
            None,
            "no data: the tracer wrote no interval since the last sample",
            running,
        )

    def _hold(
        self,
        now: float,
        window: WindowAggregates,
        transition: Transition | None,
        why: str,
        running: bool | None,
        waiting_for: Mapping[str, Any] | None = None,
    ) -> NodeSample:
        """The last measurement again, in the state the node keeps."""
        if why not in self.held_for:
            self.held_for.add(why)
            log.info("%s; keeping state %s (logged once)", why, self.state.state)
        last = self.last
        sample = NodeSample(
            now,
            self.state.state,
            last.result if last is not None else None,
            window,
            transition,
            stalled=self.state.stalled,
            job_running=running,
            peer_rate=last.peer_rate if last is not None else None,
            held=True,
            slowest_server=last.slowest_server if last is not None else None,
            quiet=self.state.quiet,
            waiting=self.state.waiting,
            waiting_for=waiting_for,
        )
        if self.state.waiting and last is not None:
            # Remembered as waiting (the log line above comes once a wait), measured as before.
            self.last = replace(last, waiting=True)
        return sample

    def _job_running(self, window: WindowAggregates, job_file: bool) -> bool | None:
        """Does this node's job still run, in a window without launches? Its processes say
        first: listed on a GPU by NVML (a stopped or hung process still holds its context),
        or the processes that last launched still alive; else its job file; else unknown."""
        if window.gpu_pids:
            return True
        if self.traced_pids:
            return any(self.pid_alive(pid) for pid in self.traced_pids)
        return True if job_file else None

    def _learn(self, rates: dict[str, float | None]) -> None:
        """One learning sample: every measured rate updates its baseline."""
        for name, rate in rates.items():
            if rate is None:
                continue
            self.baselines.baselines.setdefault(
                name,
                EmaBaseline(alpha=self.config.ema_alpha, alpha_down=self.config.ema_alpha_down),
            ).update(rate)
        self.baselines.samples += 1
        if self.store is not None:
            try:
                self.store.save(self.baselines)
            except OSError as exc:
                log.warning("cannot save baselines to %s: %s", self.store.path, exc)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


def _utilization(status: GpuStatus) -> float | None:
    """Mean utilization of the GPUs a live query measured it on, as a fraction."""
    values = [g.utilization_percent for g in status.gpus if g.utilization_percent is not None]
    return min(1.0, sum(values) / len(values) / 100.0) if values else None
