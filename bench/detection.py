"""Detection on real-shaped data, in simulated time (no sockets, no processes).

Each simulated node is one training process of one Slurm job, shaped like what ``ingero
trace`` recorded on an H100 (``ingero.workload.generator``, ``--shape gpu-bound``,
``cpu-bound`` or ``graphs``), or ``--servers`` inference servers of one model (``--shape
inference``: each a decode stream with prefill steps on it, recognised by fleet-push's own
engine watcher in a synthetic /proc, a slowdown slowing one server of them, a stall
stopping them all; ``--no-streams``: the node DB without their stream rows, as a tracer
before node DB version 6 writes it, so each server steps at its syncs per second): tracer
intervals (1 s, ``--tracer-interval``) of cuLaunchKernel (cudaGraphLaunch: a job replaying CUDA graphs), rare syncs,
off-CPU rows, host rows and NVML GPU rows (``--no-nvml``: none, as on the reference H100
node, where the score has no compute signal and memory is the host's), with multiplicative
noise on every rate, each interval's rows written a random 0..``--late`` s after it ends.
Each node's tracer and agent
start at their own moment, and the agent pushes every ``--push-interval`` x (1 ±
``--push-jitter``). At each push the node's window is placed and interpreted by the same
code as fleet-push (``ingero.nodedb.window``: ``window_start``, ``nothing_new``,
``aggregate_window``) over the rows written by then, and scored by fleet-push's own sampler (``NodeSampler.evaluate``: node state, stall,
baselines, GPU health, score); the pushes go to Fleet's threshold engine (``FleetState``),
and each node classifies itself with its detection selector and hysteresis classifier
against the threshold of Fleet's previous tick, as a push response gives it (both sides
enter after ``--enter-intervals`` intervals below of the last ``--enter-window``, and end
after ``--exit-intervals`` in a row at threshold + hysteresis). The push reply
also carries the group's peer medians of the raw rates, which the node's next sample
measures its throughput against (``--no-peers``: node-local baselines only, as before), and
Fleet's open episode id, which the node adopts; the node pushes its own. A push that found
no new tracer interval holds and is not classified, as in the agent. One ManualClock
drives all; every process is alive unless its job ended.

Prints, per shape: the healthy score distribution; the score drop of a node slowed by 10%,
20% and 30% (its median score over the first 12 intervals after the slowdown, against the
healthy nodes' median in the same intervals); detection latency at 10% and 20% (push
intervals from the slowdown to the node's first straggler_state, over seeded runs: median,
p95, misses) and whether Fleet flagged the same node under the same event_id; a node 10%
and one 20% slower for ``--persist`` intervals (its episodes, node and Fleet, the flaps
among them: episodes beyond the first, and the share of the time it was flagged after its
first flag: a straggler that stays slow stays flagged), then back at its peers' speed (push
intervals to the end of its episode, node and Fleet: the recovery delay); a
node 25% slower from its first interval; a rank that stalls (and how its episode ends when its job
then ends); and false straggler events (node's and Fleet's) per node-hour, GPU events,
pushes that said stalled and the share of held samples of the nodes in a steady simulated
hour, and how far the healthy nodes' scores sit above the threshold (mean and sd of
score - threshold, and how many classified intervals fell below it).

    .venv/bin/python bench/detection.py [--shape gpu-bound|cpu-bound|graphs|all] [--nodes 64]
        [--runs 20] [--hours 1] [--noise 0.03] [--enter-intervals 3] [--enter-window 5]
        [--exit-intervals 2]
        [--min-margin 0.04] [--no-peers]
        [--push-interval 5] [--tracer-interval 1] [--push-jitter 0.1] [--late 0] [--no-nvml]
        [--rate-window 0] [--explain 0] [--persist 120] [--servers 4] [--no-streams]
        [--gpu-mem-used GIB]

``--explain N`` prints, for the 10% runs, the slowed node's score - threshold over
intervals 2-13 (mean, sd, correlation of one interval with the next), what independent
intervals with the same share below would give under the enter rule, and the N slowest
runs interval by interval (rate, reference, signals, busy baseline, score, threshold).

``--rate-window W`` measures a candidate fleet-push does not have: the rates over at least
the last W seconds of tracer intervals instead of the push window only (the new intervals,
and so the stall rule, stay the push window's).
"""

from __future__ import annotations

import argparse
import atexit
import itertools
import logging
import random
import shutil
import statistics
import sys
import tempfile
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

from ingero.fleet.config import FleetConfig, ThresholdConfig
from ingero.fleet.state import FleetState
from ingero.nodedb.window import (
    LOOKBACK_WINDOWS,
    WindowAggregates,
    aggregate_window,
    nothing_new,
    window_start,
)
from ingero.otlp.health import NodePush
from ingero.otlp.threshold import ThresholdView
from ingero.push.classifier import Classifier, Observation
from ingero.push.config import ClassifierConfig, PushConfig
from ingero.push.detection import FLEET_MODES, DetectionSelector
from ingero.push.engines import EngineWatcher
from ingero.push.sampler import NodeSample, NodeSampler
from ingero.runtime.clock import ManualClock
from ingero.runtime.config import Duration
from ingero.schema.events import Event
from ingero.workload.generator import SHAPE_NAMES, TickRows, WorkloadGenerator, WorkloadProfile
from ingero.workload.runner import SyntheticProc

JOB = "4242"
SERVER_PID = 1000  # every simulated node's first inference server (each node is a host)


@cache
def engines_proc(servers: int) -> Path:
    """A /proc holding ``servers`` inference servers, the same on every simulated node."""
    root = Path(tempfile.mkdtemp(prefix="ingero-bench-proc-"))
    atexit.register(shutil.rmtree, root, True)
    SyntheticProc(root).servers(tuple(range(SERVER_PID, SERVER_PID + servers)))
    return root


class Timing:
    """Cadences of the run (set from the command line): push and tracer intervals, the
    agents' push jitter, and how late a tracer writes an interval's rows."""

    push = 5.0  # push interval (Fleet's default)
    tracer = 1.0  # ingero trace's default interval
    jitter = PushConfig().jitter  # each push comes after push x (1 ± this)
    late = 0.0  # each interval's rows are written up to this many seconds after it ends
    nvml = True  # cleared by --no-nvml: no GPU rows, as on the reference H100 node
    gpu_mem_used: float | None = None  # --gpu-mem-used: GiB per GPU (None: the shape's)
    rate_window = 0.0  # --rate-window: rates over at least this many seconds (0: one push)
    servers = 4  # --servers: inference servers per node (--shape inference)
    streams = True  # cleared by --no-streams: no stream_intervals rows (an older tracer)


class Written:
    """One tracer interval's rows and when they land in the node DB."""

    def __init__(self, ts_start: float, ts_end: float, at: float, rows: TickRows) -> None:
        self.ts_start, self.ts_end, self.at, self.rows = ts_start, ts_end, at, rows


class SimNode:
    def __init__(
        self, rank: int, shape: str, noise: float, seed: int, clock: ManualClock, config: PushConfig
    ) -> None:
        self.name = f"n{rank:03d}"
        self.rank = rank
        self.clock = clock
        self.rng = random.Random(seed * 7919 + rank)
        inference = shape == "inference"
        profile = WorkloadProfile(
            shape=shape,
            noise=noise,
            job_id=JOB,
            rank=rank,
            pid=SERVER_PID if inference else 1000 + rank,
            servers=Timing.servers if inference else 1,
            gpu_mem_used=Timing.gpu_mem_used,
        )
        self.gen = WorkloadGenerator(profile, seed=seed * 1000 + rank)
        engines = None
        if inference:
            # fleet-push's own watcher, over the servers' synthetic /proc entries (their
            # /metrics off: their steps come from the decode streams).
            engines = EngineWatcher(
                db_path=Path("/nonexistent/node.db"),
                clock=clock,
                proc_root=engines_proc(Timing.servers),
            )
            engines.observe()
        self.sampler = NodeSampler(
            node_id=self.name,
            db_path=Path("/nonexistent/node.db"),  # windows come from the generator
            config=config.score,
            window_s=Timing.push,
            clock=clock,
            pid_alive=lambda pid: not self.ended,
            engines=engines,
        )
        self.selector = DetectionSelector(config.detection, clock)
        self.classifier = Classifier(config.classifier)
        self.mode: str | None = None  # the last decision's (the agent's status.mode)
        self._slowdown = 0.0
        self._stalled = False
        self.ended = False  # the job ended: the process exited, nothing is written
        self.reply: ThresholdView | None = None  # the last push reply
        # Each node's tracer and agent started at their own moment.
        start = clock.now()
        self.tracer_end = start + self.rng.uniform(0, Timing.tracer)
        self.next_push = start + self.rng.uniform(0, Timing.push)
        self.written: list[Written] = []  # rows in the node DB or on their way there
        self.held = 0  # samples that found no new tracer interval
        self.gaps: list[float] = []  # score - threshold of each classified interval

    # A change of the workload applies to the tracer intervals after it.
    @property
    def slowdown(self) -> float:
        return self._slowdown

    @slowdown.setter
    def slowdown(self, value: float) -> None:
        self.trace(self.clock.now())
        self._slowdown = value

    @property
    def stalled(self) -> bool:
        return self._stalled

    @stalled.setter
    def stalled(self, value: bool) -> None:
        self.trace(self.clock.now())
        self._stalled = value

    def trace(self, now: float) -> None:
        """The tracer's intervals that ended by ``now``, each written up to ``late`` after."""
        while self.tracer_end + Timing.tracer <= now and not self.ended:
            start, self.tracer_end = self.tracer_end, self.tracer_end + Timing.tracer
            at = self.tracer_end + self.rng.uniform(0.0, Timing.late)
            rows = self.gen.tick(start, self.tracer_end, self._slowdown, self._stalled)
            if not Timing.nvml:  # nothing on the node writes GPU rows: compute is missing
                rows.gpu_intervals, rows.gpu_processes = [], []
            self.written.append(Written(start, self.tracer_end, at, rows))
        # What no window can reach any more is history.
        reach = max((LOOKBACK_WINDOWS + 2) * Timing.push, Timing.rate_window + Timing.push)
        horizon = now - reach - Timing.tracer
        while self.written and self.written[0].ts_end < horizon:
            self.written.pop(0)

    def window(self, now: float) -> WindowAggregates:
        """What ``read_latest`` reads of this node DB now."""
        self.trace(now)
        visible = [w for w in self.written if w.at <= now and w.ts_end <= now]
        after = self.sampler.anchor
        latest = max((w.ts_end for w in visible), default=None)
        if latest is None or (after is not None and latest <= after):
            return nothing_new(now, Timing.push, after, latest)
        start = window_start(latest, Timing.push, after)
        # A candidate measured here only: the rates over a longer window than one push (the
        # new intervals, and so the stall rule, stay those after ``after``).
        start = min(start, latest - Timing.rate_window)
        # One window back as well: where GPU counter growth is counted from.
        gpu_rows = [
            r for w in visible if w.ts_end > start - Timing.push for r in w.rows.gpu_intervals
        ]
        inside = [w for w in visible if start < w.ts_end <= latest]
        return aggregate_window(
            start,
            latest,
            [r for w in inside for r in w.rows.intervals],
            gpu_rows,
            [r for w in inside for r in w.rows.gpu_processes],
            [r for w in inside for r in w.rows.host_intervals],
            stream_rows=[r for w in inside for r in w.rows.stream_intervals]
            if Timing.streams
            else [],
            after=after,
            latest_end=latest,
        )

    def sample(self, peers: bool = True, **more: Any) -> NodeSample:
        """fleet-push's sample of the node DB now; ``more``: the sampler's further inputs."""
        now = self.clock.now()
        window = self.window(now)
        new = [w for w in self.written if w.at <= now and w.ts_end > (self.sampler.anchor or 0)]
        cpu = [w.rows.cpu_busy for w in new]
        mem = [w.rows.mem_available for w in new]
        medians = self.reply.peer_rates if peers and self.reply is not None else None
        sample = self.sampler.evaluate(
            window,
            now,
            statistics.mean(cpu) if cpu else None,
            statistics.mean(mem) if mem else None,
            medians,
            not self.ended,  # the job file goes with the job
            straggling=self.classifier.straggling and self.mode in FLEET_MODES,
            **more,
        )
        self.held += sample.held
        return sample

    def push(self, sample: NodeSample) -> NodePush:
        result = sample.result
        return NodePush(
            node_id=self.name,
            cluster_id="bench",
            score=sample.score,
            state=sample.state,
            job_id=JOB,
            rank=self.rank,
            dominant_signal=result.dominant_signal if result else None,
            signals=dict(result.signals) if result else {},
            rates=dict(result.rates) if result else {},
            stalled=sample.stalled,
            episode_id=self.classifier.episode_id,
            held=sample.held,
        )

    def classify(
        self, push: NodePush, sample: NodeSample, reading: ThresholdView, lag: bool = False
    ) -> list[Event]:
        """As the agent does: a held sample is neither learnt from nor classified; ``lag``:
        with the reply's NCCL peer lag of the node (lock-step jobs)."""
        self.reply = reading
        self.selector.on_fleet(reading)
        measured = push.state == "active" and not sample.held
        decision = self.selector.decide(push.score if measured else None)
        self.mode = decision.mode
        if sample.held:
            return []
        if measured and decision.threshold is not None:
            self.gaps.append(push.score - decision.threshold)
        observation = Observation.of(
            push,
            decision,
            self.clock.now(),
            job_ended=sample.job_running is False,
            fleet_episode=reading.episode_id,
            peer_lag=reading.peer_lag if lag else None,
        )
        return self.classifier.observe(observation)


class Sim:
    enter_intervals = ClassifierConfig().enter_intervals  # set from --enter-intervals
    enter_window = ClassifierConfig().enter_window  # set from --enter-window
    exit_intervals = ClassifierConfig().exit_intervals  # set from --exit-intervals
    peers = True  # cleared by --no-peers
    min_margin = ThresholdConfig().min_margin  # set from --min-margin
    noise_k = ThresholdConfig().noise_k  # set from --noise-k

    def __init__(self, shape: str, nodes: int, seed: int, noise: float) -> None:
        self.clock = ManualClock()
        self.fleet = FleetState(
            FleetConfig(
                push_interval=Duration(Timing.push),
                threshold=ThresholdConfig(
                    enter_intervals=Sim.enter_intervals,
                    enter_window=Sim.enter_window,
                    exit_intervals=Sim.exit_intervals,
                    min_margin=Sim.min_margin,
                    noise_k=Sim.noise_k,
                ),
            ),
            self.clock,
        )
        config = PushConfig(
            classifier=ClassifierConfig(
                enter_intervals=Sim.enter_intervals,
                enter_window=Sim.enter_window,
                exit_intervals=Sim.exit_intervals,
            )
        )
        self.nodes = [SimNode(i, shape, noise, seed, self.clock, config) for i in range(nodes)]
        self.scores: dict[str, float] = {}
        self.states: dict[str, str] = {}
        self.gpu_events = 0
        self.stalled_pushes: dict[str, int] = {}  # pushes that said stalled, per node
        self.node_events: list[Event] = []  # every straggler event, node side
        self.fleet_events: list[Event] = []  # ... and Fleet side
        self.group_noise: list[float] = []  # the job's noise as Fleet saw it, every tick

    def step(self) -> dict[str, list[str]]:
        """One push interval: every node's pushes in it (each at its own jittered time, in
        time order), then Fleet's tick; returns each node's straggler event types."""
        end = self.clock.now() + Timing.push
        out: dict[str, list[str]] = {}
        while True:
            node = min(self.nodes, key=lambda n: n.next_push)
            if node.next_push > end:
                break
            self.clock.advance(node.next_push - self.clock.now())
            node.next_push += Timing.push * (1 + node.rng.uniform(-Timing.jitter, Timing.jitter))
            sample = node.sample(Sim.peers)
            self.gpu_events += len(sample.gpu_findings)
            push = node.push(sample)
            self.scores[node.name] = push.score
            self.states[node.name] = "stalled" if push.stalled else push.state
            self.stalled_pushes[node.name] = self.stalled_pushes.get(node.name, 0) + push.stalled
            if sample.held and sample.result is None:
                continue  # the agent does not push before it has measured anything
            view = self.fleet.ingest(push)
            events = [
                e for e in node.classify(push, sample, view) if e.type.startswith("straggler")
            ]
            self.node_events += events
            if events:
                out.setdefault(node.name, []).extend(e.type for e in events)
        self.clock.advance(end - self.clock.now())
        tick = self.fleet.tick()
        self.fleet_events += [e for e in tick.events if e.type.startswith("straggler")]
        self.group_noise += [g.noise for g in tick.groups if g.noise is not None]
        return out

    def fleet_flagged(self, node: str) -> bool:
        return any(e.type == "straggler_state" and e.node_id == node for e in self.fleet_events)

    def fleet_straggling(self, node: str) -> bool:
        """Whether Fleet has an episode of ``node`` open (its last event of one is a start)."""
        mine = [e.type for e in self.fleet_events if e.node_id == node]
        return bool(mine) and mine[-1] == "straggler_state"

    def agreement(self, node: str) -> str:
        """Whether Fleet flagged ``node`` too, and under the node's event_id."""
        mine = {e.event_id for e in self.node_events if e.node_id == node}
        fleet = {e.event_id for e in self.fleet_events if e.node_id == node}
        if not fleet:
            return "Fleet did not flag it"
        return "Fleet too, same event_id" if fleet == mine else f"ids {mine} vs {fleet}"

    def warm(self, intervals: int) -> None:
        for _ in range(intervals):
            self.step()


def percentile(values: Iterable[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def healthy_and_drops(
    shape: str, nodes: int, noise: float, warmup: int, levels: list[float]
) -> tuple[list[float], dict[float, float]]:
    """Healthy scores of every active node after warm-up, and each level's score drop."""
    healthy: list[float] = []
    drops: dict[float, float] = {}
    for i, level in enumerate(levels):
        sim = Sim(shape, nodes, seed=900 + i, noise=noise)
        sim.warm(warmup)
        target = sim.nodes[0]
        target.slowdown = level
        slowed, peers = [], []
        for _ in range(12):
            sim.step()
            slowed.append(sim.scores[target.name])
            peers += [s for n, s in sim.scores.items() if n != target.name]
        if i == 0:
            healthy = peers
        drops[level] = statistics.median(peers) - statistics.median(slowed)
    return healthy, drops


class Explain:
    """What ``--explain`` looks at: the slowed node's score against the threshold it was
    judged by, interval by interval after the slowdown (the peers' median score beside it)."""

    runs: ClassVar[dict[int, list[str]]] = {}  # seed -> one line per interval, for the slowest runs
    gaps: ClassVar[dict[int, list[float]]] = {}  # seed -> score - threshold per classified interval
    # (throughput signal, threshold, the peers' median score) of those intervals
    parts: ClassVar[list[tuple[float, float, float]]] = []

    @staticmethod
    def interval(sim: Sim, target: SimNode, interval: int) -> tuple[str, float] | None:
        last, reply = target.sampler.last, target.reply
        if last is None or last.result is None or reply is None or reply.threshold is None:
            return None
        r = last.result
        rates, signals = r.rates, r.signals
        reference = rates.get("throughput_peer_median") or rates.get("throughput_baseline")
        peers = statistics.median(s for n, s in sim.scores.items() if n != target.name)
        gap = r.score - reply.threshold
        line = (
            f"  {interval:3d}  rate {rates.get('kernel_launch_rate') or 0:8.1f}  "
            f"{'peer median' if rates.get('throughput_peer_median') else 'own baseline'} "
            f"{reference or 0:8.1f}  throughput {signals.get('throughput', 0):.3f}  "
            f"compute {signals.get('compute', float('nan')):.3f}  busy baseline "
            f"{rates.get('gpu_busy_baseline', float('nan')):.3f}  score {r.score:.4f}  "
            f"threshold {reply.threshold:.4f}  gap {gap:+.4f}  "
            f"peers' median score {peers:.4f}" + ("  (held)" if last.held else "")
        )
        return line, gap

    @staticmethod
    def of(sim: Sim, target: SimNode) -> tuple[float, float, float]:
        """The slowed node's throughput signal, its threshold and the peers' median score."""
        assert target.sampler.last is not None and target.sampler.last.result is not None
        assert target.reply is not None and target.reply.threshold is not None
        peers = statistics.median(s for n, s in sim.scores.items() if n != target.name)
        signal = target.sampler.last.result.signals.get("throughput", float("nan"))
        return signal, target.reply.threshold, peers


def latency(
    shape: str,
    nodes: int,
    noise: float,
    runs: int,
    slowdown: float,
    warmup: int,
    limit: int,
    explain: bool = False,
) -> tuple[list[int], int, int, list[int]]:
    """Intervals to the node's detection per run, misses, runs where Fleet flagged the same
    node under the same event_id (two intervals after the node's detection), and intervals
    to Fleet's own first ``straggler_state`` of the node in the runs where it came.
    ``explain``: keep every run's intervals in ``Explain``."""
    found, missed, agreed, by_fleet = [], 0, 0, []
    for seed in range(runs):
        sim = Sim(shape, nodes, seed, noise)
        sim.warm(warmup)
        target = sim.nodes[0]
        target.slowdown = slowdown
        node_at: int | None = None
        fleet_at: int | None = None
        for interval in range(1, limit + 3):
            flagged = "straggler_state" in sim.step().get(target.name, [])
            seen = Explain.interval(sim, target, interval) if explain else None
            if seen is not None:
                line, gap = seen
                if node_at is None:
                    flag = "  FLAGGED" if flagged else ""
                    Explain.runs.setdefault(seed, []).append(line + flag)
                # A fixed span, flagged or not (a span cut at the flag would count the
                # runs that were quick to go below less), less the first interval, which
                # still holds the rate before the slowdown.
                if 2 <= interval <= 13 and "(held)" not in line:
                    Explain.gaps.setdefault(seed, []).append(gap)
                    Explain.parts.append(Explain.of(sim, target))
            if node_at is None and flagged and interval <= limit:
                node_at = interval
            if fleet_at is None and interval <= limit and sim.fleet_flagged(target.name):
                fleet_at = interval
            if node_at is not None and interval == node_at + 2:
                agreed += sim.agreement(target.name) == "Fleet too, same event_id"
            done = node_at is not None and interval >= node_at + 2 and fleet_at is not None
            if done and (not explain or interval >= 13):
                break
        if node_at is None:
            missed += 1
        else:
            found.append(node_at)
        if fleet_at is not None:
            by_fleet.append(fleet_at)
    return found, missed, agreed, by_fleet


def slow_from_birth(shape: str, nodes: int, noise: float, limit: int) -> tuple[int | None, str]:
    """Intervals from the job's start to the node's first straggler_state, and agreement."""
    sim = Sim(shape, nodes, seed=77, noise=noise)
    sim.nodes[0].slowdown = 0.25
    for interval in range(1, limit + 1):
        if "straggler_state" in sim.step().get(sim.nodes[0].name, []):
            sim.step()
            sim.step()
            return interval, sim.agreement(sim.nodes[0].name)
    return None, ""


# Push intervals a node back at its peers' speed is watched for its episode's end.
RECOVER_LIMIT = 30


class Persisted:
    """``persistent``'s figures, one entry per run: the episodes the node and Fleet started
    while it was slow (the flagged share says whether one lasted), the share of the
    intervals after the node first flagged it that it spent in an episode, and the push
    intervals from its return to speed to the ``straggler_resolved`` of the node and of
    Fleet (None: no episode open then, or none ended within RECOVER_LIMIT)."""

    def __init__(self) -> None:
        self.node_eps: list[int] = []
        self.fleet_eps: list[int] = []
        self.share: list[float] = []
        self.node_back: list[int | None] = []
        self.fleet_back: list[int | None] = []


def persistent(
    shape: str, nodes: int, noise: float, runs: int, warmup: int, intervals: int, level: float
) -> Persisted:
    """A node ``level`` slower for ``intervals`` push intervals, then back at its peers'
    speed, ``runs`` seeded runs."""
    out = Persisted()
    for seed in range(runs):
        sim = Sim(shape, nodes, seed, noise)
        sim.warm(warmup)
        target = sim.nodes[0]
        target.slowdown = level
        since: int | None = None
        straggling = 0
        for interval in range(1, intervals + 1):
            sim.step()
            if since is None and target.classifier.straggling:
                since = interval
            straggling += since is not None and target.classifier.straggling
        node_eps = {e.event_id for e in sim.node_events if e.node_id == target.name}
        fleet_eps = {e.event_id for e in sim.fleet_events if e.node_id == target.name}
        out.node_eps.append(len(node_eps))
        out.fleet_eps.append(len(fleet_eps))
        out.share.append(straggling / (intervals - since + 1) if since else 0.0)
        node_open, fleet_open = target.classifier.straggling, sim.fleet_straggling(target.name)
        node_ended = len(sim.node_events)
        fleet_ended = len(sim.fleet_events)
        target.slowdown = 0.0
        node_back: int | None = None
        fleet_back: int | None = None
        for interval in range(1, RECOVER_LIMIT + 1):
            sim.step()
            if node_back is None and node_open and resolved(sim.node_events[node_ended:], target):
                node_back = interval
            if (
                fleet_back is None
                and fleet_open
                and resolved(sim.fleet_events[fleet_ended:], target)
            ):
                fleet_back = interval
            if (node_back or not node_open) and (fleet_back or not fleet_open):
                break
        out.node_back.append(node_back)
        out.fleet_back.append(fleet_back)
    return out


def resolved(events: list[Event], node: SimNode) -> bool:
    return any(e.type == "straggler_resolved" and e.node_id == node.name for e in events)


def back_figures(delays: list[int | None]) -> str:
    """Intervals from the return to speed to the episode's end, over the runs that had one."""
    ended = [d for d in delays if d is not None]
    if not ended:
        return "none ended"
    return (
        f"median {statistics.median(ended):g}, p95 {percentile(ended, 0.95):g}, "
        f"max {max(ended)} ({len(ended)} runs)"
    )


def stall(
    shape: str, nodes: int, noise: float, warmup: int
) -> tuple[int | None, list[str], str, str]:
    """Intervals to the stalled node's first straggler_state (within 10), its states, how
    its episode ended when its job then ended (node side, Fleet side), and agreement."""
    sim = Sim(shape, nodes, seed=78, noise=noise)
    sim.warm(warmup)
    target = sim.nodes[0]
    target.stalled = True
    flagged: int | None = None
    states = []
    for interval in range(1, 11):
        if "straggler_state" in sim.step().get(target.name, []) and flagged is None:
            flagged = interval
        states.append(sim.states[target.name])
    agreement = sim.agreement(target.name)
    target.ended = True
    for _ in range(3):
        sim.step()
        states.append(sim.states[target.name])

    def ending(events: list[Event]) -> str:
        return ",".join(
            str(e.extra.get("reason"))
            for e in events
            if e.node_id == target.name and e.type == "straggler_resolved"
        )

    return flagged, states, f"{ending(sim.node_events)} / {ending(sim.fleet_events)}", agreement


def false_events(
    shape: str, nodes: int, noise: float, hours: float, warmup: int
) -> tuple[int, int, int, int, int, list[float], list[list[float]]]:
    """Episodes the nodes and Fleet started in a steady time, GPU events, pushes that said
    stalled, samples held for want of new tracer data, the group's noise as Fleet saw it
    at every tick, and each node's classified intervals' score - threshold in order (how
    far the healthy nodes sit above it)."""
    sim = Sim(shape, nodes, seed=10_000, noise=noise)
    sim.warm(warmup)
    sim.gpu_events = 0
    sim.node_events.clear()
    sim.fleet_events.clear()
    sim.stalled_pushes.clear()
    for each in sim.nodes:
        each.held = 0
        each.gaps.clear()
    sim.group_noise.clear()
    for _ in range(int(hours * 3600 / Timing.push)):
        sim.step()
    node = len({e.event_id for e in sim.node_events if e.type == "straggler_state"})
    fleet = len({e.event_id for e in sim.fleet_events if e.type == "straggler_state"})
    stalled = sum(sim.stalled_pushes.values())
    held = sum(n.held for n in sim.nodes)
    gaps = [list(n.gaps) for n in sim.nodes]
    return node, fleet, sim.gpu_events, stalled, held, sim.group_noise, gaps


def fmt(values: list[int], missed: int, runs: int) -> str:
    if not values:
        return f"not detected in {runs} runs"
    return (
        f"median {statistics.median(values):g}, p95 {percentile(values, 0.95):g}, "
        f"max {max(values)} intervals; missed {missed}/{runs}"
    )


def explain_runs(slowest: int) -> None:
    """The slowed node's gap to its threshold over every run at 10% (mean, sd, and the
    correlation of one interval's gap with the next: noise around a mean or a lasting
    bias), then the slowest runs interval by interval."""
    gaps = [g for run in Explain.gaps.values() for g in run]
    if len(gaps) < 2:
        return
    mean, sd = statistics.mean(gaps), statistics.pstdev(gaps)
    pairs = [(a, b) for run in Explain.gaps.values() for a, b in itertools.pairwise(run)]
    lag1 = sum((a - mean) * (b - mean) for a, b in pairs) / (len(pairs) * sd * sd or 1.0)
    print(
        f"  10%, the slowed node in intervals 2-13: score - threshold mean {mean:+.4f}, sd "
        f"{sd:.4f}, correlation with the next interval {lag1:+.2f}; below in "
        f"{sum(g < 0 for g in gaps)} of {len(gaps)} classified intervals"
    )
    # Were the slow runs a lasting bias or bad luck? Independent intervals, each below with
    # the share seen, under the same enter rule (the first interval after the slowdown is
    # still mostly the old rate, so it is never below here).
    share = sum(g < 0 for g in gaps) / len(gaps)
    rng, model = random.Random(0), []
    for _ in range(20_000):
        window: list[bool] = []
        interval = 1
        while True:
            interval += 1
            below = rng.random() < share
            window = [*window, below][-Sim.enter_window :]
            if below and sum(window) >= Sim.enter_intervals:
                model.append(interval)
                break
    print(
        f"  independent intervals, each below with p = {share:.2f}, would be flagged after "
        f"median {statistics.median(model):g}, p95 {percentile(model, 0.95):g} intervals"
    )
    throughput, threshold, peers = (statistics.mean(p) for p in zip(*Explain.parts, strict=True))
    print(
        f"  over those intervals: its throughput signal {throughput:.3f}, threshold "
        f"{threshold:.4f}, the peers' median score {peers:.4f} ({peers - threshold:.4f} above "
        "the threshold)"
    )
    for seed in sorted(Explain.runs, key=lambda s: -len(Explain.runs[s]))[:slowest]:
        print(f"  seed {seed}:")
        print("\n".join(Explain.runs[seed]))
    Explain.runs.clear()
    Explain.gaps.clear()
    Explain.parts.clear()


def main() -> None:
    if "--lockstep" in sys.argv[1:]:
        # Lock-step training jobs are their own suite, which imports this one.
        sys.exit("lock-step jobs: python -m bench.lockstep [--runs 10] [--after 420] [--no-nvml]")
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--shape", choices=[*SHAPE_NAMES, "all"], default="all")
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--runs", type=int, default=20, help="seeded runs per latency figure")
    parser.add_argument("--hours", type=float, default=1.0, help="steady time for false events")
    parser.add_argument("--noise", type=float, default=0.03, help="relative sd per 1 s interval")
    parser.add_argument("--warmup", type=int, default=30, help="intervals before injecting")
    parser.add_argument("--limit", type=int, default=60, help="intervals to wait for detection")
    parser.add_argument("--enter-intervals", type=int, default=Sim.enter_intervals,
                        help="enter rule of both sides (consecutive intervals below)")  # fmt: skip
    parser.add_argument("--enter-window", type=int, default=Sim.enter_window,
                        help="... of the last this many intervals")  # fmt: skip
    parser.add_argument("--exit-intervals", type=int, default=Sim.exit_intervals,
                        help="exit rule of both sides (intervals in a row recovered)")  # fmt: skip
    parser.add_argument("--min-margin", type=float, default=Sim.min_margin,
                        help="Fleet's threshold.min_margin")  # fmt: skip
    parser.add_argument("--noise-k", type=float, default=Sim.noise_k,
                        help="Fleet's threshold.noise_k (0: no noise term)")  # fmt: skip
    parser.add_argument("--no-peers", action="store_true",
                        help="node-local baselines only (ignore the reply's peer medians)")  # fmt: skip
    parser.add_argument("--push-interval", type=float, default=Timing.push)
    parser.add_argument("--tracer-interval", type=float, default=Timing.tracer)
    parser.add_argument("--push-jitter", type=float, default=Timing.jitter,
                        help="each push comes after push interval x (1 ± this)")  # fmt: skip
    parser.add_argument("--late", type=float, default=Timing.late,
                        help="the tracer writes each interval's rows up to this late (s)")  # fmt: skip
    parser.add_argument("--rate-window", type=float, default=0.0,
                        help="rates over at least this many seconds back (0: one push window)")  # fmt: skip
    parser.add_argument("--explain", type=int, default=0, metavar="N",
                        help="print the N slowest runs at 10%%, interval by interval")  # fmt: skip
    parser.add_argument("--persist", type=int, default=120, metavar="I",
                        help="a node 10%% and one 20%% slower for I intervals, then back: "
                             "episodes, flaps, recovery (0: skip)")  # fmt: skip
    parser.add_argument("--servers", type=int, default=Timing.servers,
                        help="inference servers per node (--shape inference)")  # fmt: skip
    parser.add_argument("--no-streams", action="store_true",
                        help="no stream rows: servers step at their syncs per second")  # fmt: skip
    parser.add_argument("--no-nvml", action="store_true",
                        help="no GPU rows (the reference H100 node: nothing wrote them)")  # fmt: skip
    parser.add_argument("--gpu-mem-used", type=float, default=None,
                        help="GPU memory used per GPU, GiB (default: the shape's)")  # fmt: skip
    args = parser.parse_args()
    Timing.push, Timing.tracer = args.push_interval, args.tracer_interval
    Timing.nvml = not args.no_nvml
    Timing.gpu_mem_used = args.gpu_mem_used
    Timing.rate_window = args.rate_window
    Timing.servers = args.servers
    Timing.streams = not args.no_streams
    Timing.jitter, Timing.late = args.push_jitter, args.late
    logging.getLogger("ingero").setLevel(logging.ERROR)  # the stall's log lines, not figures
    Sim.enter_intervals = args.enter_intervals
    Sim.enter_window = args.enter_window
    Sim.exit_intervals = args.exit_intervals
    Sim.peers = not args.no_peers
    Sim.min_margin = args.min_margin
    Sim.noise_k = args.noise_k
    shapes = list(SHAPE_NAMES) if args.shape == "all" else [args.shape]
    margin = Sim.min_margin
    for shape in shapes:
        n, noise = args.nodes, args.noise
        print(
            f"== {shape}: {n} nodes, push interval {Timing.push:g} s (±{Timing.jitter:.0%}), "
            f"tracer interval {Timing.tracer:g} s, rows up to {Timing.late:g} s late, "
            + ("" if Timing.nvml else "no GPU rows, ")
            + (
                f"inference servers a node: {Timing.servers}, one slowed, "
                + ("" if Timing.streams else "no stream rows (syncs per second), ")
                if shape == "inference"
                else ""
            )
            + f"min_margin {margin:g}, noise_k {Sim.noise_k:g}, "
            f"noise {noise:.0%} per interval, "
            f"enter_intervals {Sim.enter_intervals} of {Sim.enter_window}, "
            f"exit_intervals {Sim.exit_intervals}, "
            + ("peer ratio" if Sim.peers else "node-local baselines only")
        )
        healthy, drops = healthy_and_drops(shape, n, noise, args.warmup, [0.1, 0.2, 0.3])
        print(
            f"healthy score: min {min(healthy):.3f}, p5 {percentile(healthy, 0.05):.3f}, "
            f"median {statistics.median(healthy):.3f}, p95 {percentile(healthy, 0.95):.3f}, "
            f"max {max(healthy):.3f} ({len(healthy)} node-intervals)"
        )
        print(
            "score drop (median of peers - median of the slowed node, 12 intervals): "
            + ", ".join(f"{level:.0%}: {drop:.3f}" for level, drop in drops.items())
            + f" (min_margin {margin:g})"
        )
        for level in (0.1, 0.2):
            explain = level == 0.1 and args.explain > 0
            found, missed, agreed, by_fleet = latency(
                shape, n, noise, args.runs, level, args.warmup, args.limit, explain
            )
            print(
                f"detection at {level:.0%}: {fmt(found, missed, args.runs)}; "
                f"Fleet flagged it under the same event_id in {agreed}/{len(found)}; "
                f"Fleet's own: {fmt(by_fleet, args.runs - len(by_fleet), args.runs)}"
            )
            if explain:
                explain_runs(args.explain)
        for level in (0.1, 0.2) if args.persist else ():
            p = persistent(shape, n, noise, args.runs, args.warmup, args.persist, level)
            # A flap: an episode beyond the first while the node stayed as slow.
            node_flaps = sum(max(e - 1, 0) for e in p.node_eps)
            fleet_flaps = sum(max(e - 1, 0) for e in p.fleet_eps)
            print(
                f"{level:.0%} slower for {args.persist} intervals: episodes per run node / "
                f"Fleet median {statistics.median(p.node_eps):g} / "
                f"{statistics.median(p.fleet_eps):g}, max {max(p.node_eps)} / "
                f"{max(p.fleet_eps)}; flaps (episodes beyond the first) node / Fleet "
                f"{node_flaps} / {fleet_flaps} in {len(p.node_eps)} runs; runs with a single "
                f"episode {sum(e == 1 for e in p.node_eps)}/{len(p.node_eps)}; flagged "
                f"{statistics.mean(p.share):.0%} of the intervals after it was first flagged "
                f"(min {min(p.share):.0%}); back at speed, its episode ended after (push "
                f"intervals) node {back_figures(p.node_back)} / Fleet "
                f"{back_figures(p.fleet_back)}"
            )
        birth, agreement = slow_from_birth(shape, n, noise, args.limit)
        print(
            "25% slower from birth: "
            + (
                f"flagged after {birth} intervals from the job's start ({agreement})"
                if birth
                else f"not flagged in {args.limit}"
            )
        )
        flagged, states, ended, agreement = stall(shape, n, noise, args.warmup)
        print(
            "stalled rank: "
            + (
                f"flagged after {flagged} intervals ({agreement})"
                if flagged
                else "not flagged in 10 intervals"
            )
            + f"; its states: {' '.join(states[:10])}; its job then ends: "
            + f"{' '.join(states[10:])}, episode ended (node / Fleet): {ended}"
        )
        node, fleet, gpu, stalled, held, group_noise, per_node = false_events(
            shape, n, noise, args.hours, args.warmup
        )
        gaps = [g for each in per_node for g in each]
        node_hours = n * args.hours
        print(
            f"steady {args.hours:g} h, {node_hours:g} node-hours: false straggler episodes "
            f"{node / node_hours:.3g} (node side, {node}) and {fleet / node_hours:.3g} (Fleet "
            f"side, {fleet}) per node-hour; {gpu} GPU events; {stalled} pushes said stalled; "
            f"{held / (node_hours * 3600 / Timing.push):.1%} of the samples found no new "
            "tracer interval and held"
        )
        # The margin in noise sigmas says more than a count of 0: an episode needs
        # enter_intervals of enter_window intervals below, each as rare as this share.
        spread = statistics.pstdev(gaps)
        print(
            f"healthy score - threshold: mean {statistics.mean(gaps):.4f}, sd {spread:.4f} "
            f"({statistics.mean(gaps) / spread:.2f} sd above), min {min(gaps):.4f}; "
            f"{sum(g < 0 for g in gaps)} of {len(gaps)} classified intervals below"
        )
        if group_noise:
            # The margin's noise term: where noise_k times it passes min_margin, it is the
            # margin.
            job = sorted(group_noise)
            print(
                f"group noise (Fleet, every tick): median {statistics.median(job):.4f}, "
                f"p5 {percentile(job, 0.05):.4f}, p95 {percentile(job, 0.95):.4f}; "
                f"noise_k x median {Sim.noise_k * statistics.median(job):.4f} against "
                f"min_margin {margin:g}"
            )


if __name__ == "__main__":
    main()
