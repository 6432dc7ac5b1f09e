"""Detection on real-shaped data, in simulated time (no sockets, no processes).

Each simulated node is one training process of one Slurm job, shaped like what ``ingero
trace`` recorded on an H100 (``ingero.workload.generator``, ``--shape gpu-bound`` or
``cpu-bound``): 1 s tracer intervals of cuLaunchKernel, rare syncs, off-CPU rows and NVML GPU
rows, with multiplicative noise on every rate. Every push interval the node's window is
interpreted by the same code as fleet-push (``ingero.collectors.nodedb.aggregate_window``)
and scored by fleet-push's own sampler (``NodeSampler.evaluate``: node state, baselines, GPU
health, score); the pushes go to Fleet's threshold engine (``FleetState``), and each node
classifies itself with its detection selector and hysteresis classifier against the
threshold of Fleet's previous tick, as a push response gives it. One ManualClock drives all.

Only node-local baselines exist on the node side today: the throughput and compute signals
compare a node with its own past. Peer-relative rates come later (Fleet side), so the "slow
from birth" and "stall" rows show what node-local baselines alone do.

Prints, per shape: the healthy score distribution; the score drop of a node slowed by 10%,
20% and 30% (its median score over the first 12 intervals after the slowdown, against the
healthy nodes' median in the same intervals); detection latency at 10% and 20% (push
intervals from the slowdown to the node's first straggler_state, over seeded runs: median,
p95, misses); a node 25% slower from its first interval; a rank that stalls; and false
straggler and GPU events of the nodes in a steady simulated hour.

    .venv/bin/python bench/detection.py [--shape gpu-bound|cpu-bound|both] [--nodes 64]
        [--runs 20] [--hours 1] [--noise 0.03] [--enter-intervals 2]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ingero.clock import ManualClock
from ingero.collectors.nodedb import aggregate_window
from ingero.config import Duration
from ingero.fleet.config import FleetConfig
from ingero.fleet.state import FleetState
from ingero.otlp.health import NodePush
from ingero.otlp.threshold import ThresholdView
from ingero.push.classifier import Classifier, Observation
from ingero.push.config import ClassifierConfig, PushConfig
from ingero.push.detection import DetectionSelector
from ingero.push.sampler import NodeSample, NodeSampler
from ingero.workload.generator import SHAPE_NAMES, WorkloadGenerator, WorkloadProfile

INTERVAL = 5.0  # push interval (Fleet's default)
TRACE = 1.0  # ingero trace's default interval
JOB = "4242"


class SimNode:
    def __init__(
        self, rank: int, shape: str, noise: float, seed: int, clock: ManualClock, config: PushConfig
    ) -> None:
        self.name = f"n{rank:03d}"
        self.rank = rank
        self.clock = clock
        self.gen = WorkloadGenerator(
            WorkloadProfile(shape=shape, noise=noise, job_id=JOB, rank=rank, pid=1000 + rank),
            seed=seed * 1000 + rank,
        )
        self.sampler = NodeSampler(
            node_id=self.name,
            db_path=Path("/nonexistent/node.db"),  # windows come from the generator
            config=config.score,
            window_s=INTERVAL,
            clock=clock,
        )
        self.selector = DetectionSelector(config.detection, clock)
        self.classifier = Classifier(config.classifier)
        self.slowdown = 0.0
        self.stalled = False
        self._before: list[dict[str, Any]] = []  # last window's GPU rows (counter growth)

    def sample(self) -> NodeSample:
        end = self.clock.now()
        start = end - INTERVAL
        intervals: list[dict[str, Any]] = []
        gpu_rows: list[dict[str, Any]] = []
        processes: list[dict[str, Any]] = []
        cpu, mem = [], []
        for k in range(round(INTERVAL / TRACE)):
            rows = self.gen.tick(
                start + k * TRACE, start + (k + 1) * TRACE, self.slowdown, self.stalled
            )
            intervals += rows.intervals
            gpu_rows += rows.gpu_intervals
            processes += rows.gpu_processes
            cpu.append(rows.cpu_busy)
            mem.append(rows.mem_available)
        window = aggregate_window(start, end, intervals, self._before + gpu_rows, processes)
        self._before = gpu_rows
        return self.sampler.evaluate(window, end, statistics.mean(cpu), statistics.mean(mem))

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
        )

    def classify(self, push: NodePush, reading: ThresholdView) -> list[str]:
        self.selector.on_fleet(reading)
        decision = self.selector.decide(push.score if push.state == "active" else None)
        events = self.classifier.observe(Observation.of(push, decision, self.clock.now()))
        return [e.type for e in events]


class Sim:
    enter_intervals = ClassifierConfig().enter_intervals  # set from --enter-intervals

    def __init__(self, shape: str, nodes: int, seed: int, noise: float) -> None:
        self.clock = ManualClock()
        self.fleet = FleetState(FleetConfig(push_interval=Duration(INTERVAL)), self.clock)
        config = PushConfig(classifier=ClassifierConfig(enter_intervals=Sim.enter_intervals))
        self.nodes = [SimNode(i, shape, noise, seed, self.clock, config) for i in range(nodes)]
        self.scores: dict[str, float] = {}
        self.states: dict[str, str] = {}
        self.gpu_events = 0

    def step(self) -> dict[str, list[str]]:
        """One push interval; returns each node's straggler events."""
        self.clock.advance(INTERVAL)
        out: dict[str, list[str]] = {}
        for node in self.nodes:
            sample = node.sample()
            self.gpu_events += len(sample.gpu_findings)
            push = node.push(sample)
            self.scores[node.name], self.states[node.name] = push.score, push.state
            view = self.fleet.ingest(push)
            events = [e for e in node.classify(push, view) if e.startswith("straggler")]
            if events:
                out[node.name] = events
        self.fleet.tick()
        return out

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


def latency(
    shape: str, nodes: int, noise: float, runs: int, slowdown: float, warmup: int, limit: int
) -> tuple[list[int], int]:
    found, missed = [], 0
    for seed in range(runs):
        sim = Sim(shape, nodes, seed, noise)
        sim.warm(warmup)
        target = sim.nodes[0]
        target.slowdown = slowdown
        for interval in range(1, limit + 1):
            if "straggler_state" in sim.step().get(target.name, []):
                found.append(interval)
                break
        else:
            missed += 1
    return found, missed


def slow_from_birth(shape: str, nodes: int, noise: float, warmup: int, limit: int) -> int | None:
    sim = Sim(shape, nodes, seed=77, noise=noise)
    sim.nodes[0].slowdown = 0.25
    sim.warm(warmup)
    for interval in range(1, limit + 1):
        if "straggler_state" in sim.step().get(sim.nodes[0].name, []):
            return interval
    return None


def stall(shape: str, nodes: int, noise: float, warmup: int) -> tuple[int | None, list[str]]:
    """Intervals to the stalled node's first straggler_state (within 6), and its states."""
    sim = Sim(shape, nodes, seed=78, noise=noise)
    sim.warm(warmup)
    target = sim.nodes[0]
    target.stalled = True
    flagged: int | None = None
    states = []
    for interval in range(1, 7):
        if "straggler_state" in sim.step().get(target.name, []) and flagged is None:
            flagged = interval
        states.append(sim.states[target.name])
    return flagged, states


def false_events(
    shape: str, nodes: int, noise: float, hours: float, warmup: int
) -> tuple[int, int]:
    sim = Sim(shape, nodes, seed=10_000, noise=noise)
    sim.warm(warmup)
    sim.gpu_events = 0
    entries = 0
    for _ in range(int(hours * 3600 / INTERVAL)):
        entries += sum(ev.count("straggler_state") for ev in sim.step().values())
    return entries, sim.gpu_events


def fmt(values: list[int], missed: int, runs: int) -> str:
    if not values:
        return f"not detected in {runs} runs"
    return (
        f"median {statistics.median(values):g}, p95 {percentile(values, 0.95):g}, "
        f"max {max(values)} intervals; missed {missed}/{runs}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--shape", choices=[*SHAPE_NAMES, "both"], default="both")
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--runs", type=int, default=20, help="seeded runs per latency figure")
    parser.add_argument("--hours", type=float, default=1.0, help="steady time for false events")
    parser.add_argument("--noise", type=float, default=0.03, help="relative sd per 1 s interval")
    parser.add_argument("--warmup", type=int, default=30, help="intervals before injecting")
    parser.add_argument("--limit", type=int, default=60, help="intervals to wait for detection")
    parser.add_argument("--enter-intervals", type=int, default=Sim.enter_intervals,
                        help="classifier debounce (consecutive intervals below the threshold)")  # fmt: skip
    args = parser.parse_args()
    Sim.enter_intervals = args.enter_intervals
    shapes = list(SHAPE_NAMES) if args.shape == "both" else [args.shape]
    margin = FleetConfig().threshold.min_margin
    for shape in shapes:
        n, noise = args.nodes, args.noise
        print(
            f"== {shape}: {n} nodes, push interval {INTERVAL:g} s, noise {noise:.0%} per 1 s, "
            f"enter_intervals {Sim.enter_intervals}"
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
            found, missed = latency(shape, n, noise, args.runs, level, args.warmup, args.limit)
            print(f"detection at {level:.0%}: {fmt(found, missed, args.runs)}")
        birth = slow_from_birth(shape, n, noise, args.warmup, args.limit)
        print(
            "25% slower from birth: "
            + (f"flagged after {birth} intervals" if birth else f"not flagged in {args.limit}")
        )
        flagged, states = stall(shape, n, noise, args.warmup)
        print(
            "stalled rank: "
            + (f"flagged after {flagged} intervals" if flagged else "not flagged in 6 intervals")
            + f"; its states: {' '.join(states)}"
        )
        entries, gpu = false_events(shape, n, noise, args.hours, args.warmup)
        print(
            f"steady {args.hours:g} h: {entries} false straggler events, {gpu} GPU events "
            f"in {n * args.hours:g} node-hours"
        )


if __name__ == "__main__":
    main()
