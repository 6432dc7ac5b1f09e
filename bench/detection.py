"""Detection latency and false events, in simulated time (no sockets, no processes).

Drives the real pure parts end to end for N simulated nodes of one peer group: the health
score and its throughput baseline (``ingero.push.score``/``baseline``), Fleet's threshold
engine (``ingero.fleet.state.FleetState``), and each node's detection selector and
hysteresis classifier, all on one ManualClock. Each interval every node pushes (and reads the
threshold of Fleet's previous tick, as a real push response does), then Fleet ticks.

Inputs follow the synthetic workload's model (``ingero.workload.generator``): a slowdown s
scales kernel-launch rate and GPU busy time by (1 - s) and raises host CPU busy by s/2;
every input has multiplicative Gaussian noise.

Prints: detection latency (intervals from injection to the node's first straggler_state)
over repeated runs, median and p95; and false straggler events per node-hour in a steady
simulated hour with no slowdown.

    .venv/bin/python bench/detection.py [--nodes 64] [--runs 40] [--slowdown 0.2]
        [--hours 1] [--enter-intervals 2]
"""

from __future__ import annotations

import argparse
import random
import statistics

from ingero.clock import ManualClock
from ingero.config import Duration
from ingero.fleet.config import FleetConfig
from ingero.fleet.state import FleetState
from ingero.otlp.health import NodePush
from ingero.otlp.threshold import ThresholdView
from ingero.push.baseline import EmaBaseline
from ingero.push.classifier import Classifier, Observation
from ingero.push.config import ClassifierConfig, PushConfig
from ingero.push.detection import DetectionSelector
from ingero.push.score import ScoreInputs, compute_score

INTERVAL = 5.0
LAUNCH_RATE = 2000.0
GPU_BUSY = 0.85
CPU_BUSY = 0.3
MEM_FREE = 0.6


class SimNode:
    def __init__(self, name: str, config: PushConfig, clock: ManualClock, rng: random.Random):
        self.name = name
        self.config = config
        self.clock = clock
        self.rng = rng
        self.noise = 0.03
        self.slowdown = 0.0
        self.baseline = EmaBaseline(config.score.ema_alpha, config.score.ema_alpha_down)
        self.selector = DetectionSelector(config.detection, clock)
        self.classifier = Classifier(config.classifier)
        self.samples = 0

    def _jitter(self) -> float:
        return max(0.0, self.rng.gauss(1.0, self.noise))

    def push(self) -> NodePush:
        speed = 1.0 - self.slowdown
        rate = LAUNCH_RATE * speed * self._jitter()
        result = compute_score(
            ScoreInputs(
                throughput_rate=rate,
                throughput_baseline=self.baseline.estimate,
                gpu_busy_fraction=min(1.0, GPU_BUSY * speed * self._jitter()),
                mem_free_fraction=min(1.0, MEM_FREE * self._jitter()),
                cpu_busy_fraction=min(1.0, (CPU_BUSY + 0.5 * self.slowdown) * self._jitter()),
            ),
            self.config.score,
        )
        self.baseline.update(rate)
        self.samples += 1
        state = "active" if self.samples > self.config.score.warmup_samples else "calibrating"
        return NodePush(
            node_id=self.name,
            cluster_id="bench",
            score=result.score,
            state=state,
            workload_type="training",
            dominant_signal=result.dominant_signal,
        )

    def classify(self, push: NodePush, reading: ThresholdView) -> list[str]:
        self.selector.on_fleet(reading)
        decision = self.selector.decide(push.score if push.state == "active" else None)
        events = self.classifier.observe(Observation.of(push, decision, self.clock.now()))
        return [e.type for e in events]


class Sim:
    def __init__(self, nodes: int, seed: int, enter_intervals: int = 2) -> None:
        self.clock = ManualClock()
        self.fleet = FleetState(FleetConfig(push_interval=Duration(INTERVAL)), self.clock)
        rng = random.Random(seed)
        config = PushConfig(classifier=ClassifierConfig(enter_intervals=enter_intervals))
        self.nodes = [SimNode(f"n{i:03d}", config, self.clock, rng) for i in range(nodes)]

    def step(self) -> dict[str, list[str]]:
        """One push interval; returns the straggler events per node."""
        out: dict[str, list[str]] = {}
        for node in self.nodes:
            push = node.push()
            view = self.fleet.ingest(push)
            reading = ThresholdView(
                threshold=view.threshold, quorum_met=view.quorum_met, panic=view.panic
            )
            events = [e for e in node.classify(push, reading) if e.startswith("straggler")]
            if events:
                out[node.name] = events
        self.fleet.tick()
        self.clock.advance(INTERVAL)
        return out


def latency_run(
    nodes: int, seed: int, slowdown: float, warmup: int, limit: int, enter: int
) -> int | None:
    sim = Sim(nodes, seed, enter)
    for _ in range(warmup):
        sim.step()
    target = sim.nodes[0]
    target.slowdown = slowdown
    for interval in range(1, limit + 1):
        if "straggler_state" in sim.step().get(target.name, []):
            return interval
    return None


def false_events(nodes: int, seed: int, hours: float, warmup: int, enter: int) -> tuple[int, float]:
    sim = Sim(nodes, seed, enter)
    for _ in range(warmup):
        sim.step()
    steps = int(hours * 3600 / INTERVAL)
    entries = 0
    for _ in range(steps):
        entries += sum(ev.count("straggler_state") for ev in sim.step().values())
    return entries, nodes * hours


def percentile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--slowdown", type=float, default=0.2)
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--warmup", type=int, default=30, help="intervals before injecting")
    parser.add_argument("--limit", type=int, default=60, help="intervals to wait for detection")
    parser.add_argument("--enter-intervals", type=int, default=2, help="classifier debounce")
    args = parser.parse_args()

    latencies: list[int] = []
    missed = 0
    for seed in range(args.runs):
        got = latency_run(
            args.nodes, seed, args.slowdown, args.warmup, args.limit, args.enter_intervals
        )
        if got is None:
            missed += 1
        else:
            latencies.append(got)
    print(
        f"nodes={args.nodes} push_interval={INTERVAL}s slowdown={args.slowdown:.0%} "
        f"enter_intervals={args.enter_intervals}"
    )
    if latencies:
        print(
            f"detection latency over {args.runs} runs: median {statistics.median(latencies):g} "
            f"intervals, p95 {percentile(latencies, 0.95):g} intervals, max {max(latencies)}, "
            f"missed {missed}"
        )
    else:
        print(f"detection latency: no detection in {args.runs} runs")
    entries, node_hours = false_events(
        args.nodes, 10_000, args.hours, args.warmup, args.enter_intervals
    )
    print(
        f"steady state: {entries} false straggler events in {node_hours:g} node-hours "
        f"({entries / node_hours:.4f} per node-hour)"
    )


if __name__ == "__main__":
    main()
