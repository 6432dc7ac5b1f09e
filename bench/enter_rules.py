"""Other enter rules, judged offline on the gaps the simulated nodes were classified by.

``bench/detection.py`` runs fleet-push's sampler and classifier and Fleet's tick over
simulated nodes; each classified interval leaves the node's ``score - threshold`` (its gap)
in ``SimNode.gaps``. This bench records those gaps, of healthy nodes over a steady time and
of a node slowed by 5, 10 and 20% from a step on, and replays them through candidate enter
rules: the enter rule in use (``enter_intervals`` of the last ``enter_window`` below), and
the same with a second way in, a CUSUM (Page's cumulative sum) of ``slack - gap`` that
never falls below 0, entering at an interval below once it reaches ``limit`` (optionally
with each interval's share capped, so that one interval far below cannot make an episode
alone). For each rule it prints the false episodes of the healthy nodes (an episode ends
after ``exit_intervals`` intervals in a row at ``hysteresis`` above), how high their
deficit rose, and the intervals from the slowdown to the first flag per level. The
classifier's own first flag in the same runs, and its own false episodes in the steady
time, are printed beside as a check of the replay.

The gaps are the node's: the threshold it was given is Fleet's of the previous tick, so a
rule adopted from here must be applied by Fleet's tick and by fleet-push alike and measured
again with ``bench/detection.py``.

Usage (the case that misses 10% at p95 within 6 intervals):
    .venv/bin/python -m bench.enter_rules --shape gpu-bound --no-nvml --nodes 8 \\
        --push-interval 1 --tracer-interval 1 --late 0.05 --runs 40 --hours 8
"""

from __future__ import annotations

import argparse
import statistics
from collections import deque
from dataclasses import dataclass

from bench import detection as sim
from ingero.otlp.threshold import MAX_ENTER_WINDOW
from ingero.push.config import ClassifierConfig

LEVELS = (0.05, 0.10, 0.20)


@dataclass(frozen=True)
class Rule:
    """The count rule, and optionally a CUSUM beside it (limit 0: none)."""

    name: str
    count: int
    window: int
    slack: float = 0.0
    limit: float = 0.0
    cap: float | None = None  # the most one interval adds to the deficit (None: no cap)


class Judge:
    """One node's enter rule over its gaps, outside an episode."""

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self.recent: deque[bool] = deque(maxlen=max(rule.window, rule.count))
        self.deficit = 0.0
        self.top = 0.0  # the highest deficit seen

    def forget(self) -> None:
        self.recent.clear()
        self.deficit = 0.0

    def enters(self, gap: float) -> bool:
        rule, below = self.rule, gap < 0
        self.recent.append(below)
        add = rule.slack - gap
        if rule.cap is not None:
            add = min(add, rule.cap)
        self.deficit = max(0.0, self.deficit + add)
        self.top = max(self.top, self.deficit)
        deep = rule.limit > 0 and self.deficit >= rule.limit
        return below and (sum(self.recent) >= rule.count or deep)


def episodes(gaps: list[float], rule: Rule, hysteresis: float, exits: int) -> tuple[int, float]:
    """Episodes a healthy node's gaps start under ``rule``, and its highest deficit."""
    judge, inside, above, count = Judge(rule), False, 0, 0
    for gap in gaps:
        if not inside:
            if judge.enters(gap):
                inside, above, count = True, 0, count + 1
                judge.forget()
        else:
            above = above + 1 if gap >= hysteresis else 0
            if above >= exits:
                inside = False
    return count, judge.top


def first_flag(run: list[tuple[int, float]], rule: Rule) -> int | None:
    """The push interval (1 = the first after the slowdown) ``rule`` flags at; None: never."""
    judge = Judge(rule)
    for interval, gap in run:
        if judge.enters(gap) and interval > 0:
            return interval
    return None


def slowed_gaps(
    shape: str, nodes: int, noise: float, runs: int, level: float, warmup: int, limit: int
) -> tuple[list[list[tuple[int, float]]], list[int | None]]:
    """The slowed node's classified gaps after the step, each with its push interval (a
    jittered push interval may hold two pushes of the node, a held push none), in each
    seeded run, and the interval its classifier flagged it at."""
    out: list[list[tuple[int, float]]] = []
    flagged: list[int | None] = []
    for seed in range(runs):
        s = sim.Sim(shape, nodes, seed, noise)
        s.warm(warmup)
        target = s.nodes[0]
        # The intervals before the step are in the node's window too (interval 0 here).
        run: list[tuple[int, float]] = [(0, gap) for gap in target.gaps[-MAX_ENTER_WINDOW:]]
        target.slowdown = level
        at: int | None = None
        for interval in range(1, limit + 1):
            before = len(target.gaps)
            events = s.step().get(target.name, [])
            if at is None and "straggler_state" in events:
                at = interval
            run += [(interval, gap) for gap in target.gaps[before:]]
        out.append(run)
        flagged.append(at)
    return out, flagged


def summary(found: list[int | None]) -> str:
    hits = [f for f in found if f is not None]
    if not hits:
        return f"none of {len(found)}"
    return (
        f"{statistics.median(hits):g} / {sim.percentile(hits, 0.95):.3g} / {max(hits)}"
        f" ({len(found) - len(hits)} missed)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="gpu-bound")
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--hours", type=float, default=8.0, help="steady time of the group")
    parser.add_argument("--noise", type=float, default=0.03)
    parser.add_argument("--warmup", type=int, default=60)
    parser.add_argument("--limit", type=int, default=25, help="intervals a slowed run lasts")
    parser.add_argument("--push-interval", type=float, default=5.0)
    parser.add_argument("--tracer-interval", type=float, default=1.0)
    parser.add_argument("--late", type=float, default=0.0)
    parser.add_argument("--no-nvml", action="store_true")
    args = parser.parse_args()
    sim.Timing.push, sim.Timing.tracer = args.push_interval, args.tracer_interval
    sim.Timing.late, sim.Timing.nvml = args.late, not args.no_nvml

    c = ClassifierConfig()
    n, w = c.enter_intervals, c.enter_window
    rules = [Rule(f"{n} of {w} (in use)", n, w)]
    for slack, limit in ((0.015, 0.06), (0.015, 0.08), (0.02, 0.08), (0.02, 0.1)):
        rules.append(Rule(f"{n} of {w} or CUSUM {slack}/{limit}", n, w, slack, limit))
        rules.append(
            Rule(
                f"{n} of {w} or CUSUM {slack}/{limit}, cap {limit / n:.3g}",
                n,
                w,
                slack,
                limit,
                limit / n,
            )
        )

    print(
        f"== {args.shape}, {args.nodes} nodes, push {args.push_interval:g} s, tracer "
        f"{args.tracer_interval:g} s, late {args.late:g} s, "
        f"{'no GPU rows' if args.no_nvml else 'GPU rows'}; {args.runs} runs per level, "
        f"{args.hours * args.nodes:g} node-hours steady",
        flush=True,
    )
    slowed = {}
    for level in LEVELS:
        runs, flagged = slowed_gaps(
            args.shape, args.nodes, args.noise, args.runs, level, args.warmup, args.limit
        )
        slowed[level] = runs
        print(f"  the classifier itself, {level:.0%}: median / p95 / max {summary(flagged)}")
    node_false, *_, healthy = sim.false_events(
        args.shape, args.nodes, args.noise, args.hours, args.warmup
    )
    print(f"  the classifier itself, steady: {node_false} false episodes")
    flat = sorted(g for node in healthy for g in node)
    print(
        f"  healthy gaps: {len(flat)} classified intervals, mean {statistics.mean(flat):.4f}, "
        f"sd {statistics.pstdev(flat):.4f}, lowest {flat[0]:.4f}",
        flush=True,
    )
    print(
        "  rule | false episodes | highest healthy deficit | "
        + " | ".join(f"{level:.0%}: median / p95 / max" for level in LEVELS)
    )
    for rule in rules:
        judged = [episodes(g, rule, c.hysteresis, c.exit_intervals) for g in healthy]
        false = sum(count for count, _ in judged)
        top = f"{max(t for _, t in judged):.3f}" if rule.limit > 0 else "-"
        cells = [summary([first_flag(run, rule) for run in slowed[lv]]) for lv in LEVELS]
        print(f"  {rule.name} | {false} | {top} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
