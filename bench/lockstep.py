"""Detection on lock-step training jobs, in simulated time (``python -m bench.lockstep``).

Each job is ``--ranks`` ranks of one synchronous data-parallel job, one rank a node
(``ingero.workload.lockstep``: every rank at the pace of the slowest, ``ncclAllReduce``
returning at enqueue with one communicator hash and shared sequence numbers, the waiting
ranks in their end-of-step stream sync, NVML reading a spinning GPU as busy; ``--no-nvml``:
no GPU rows, as on the reference H100 node). ``--jobs`` jobs run side by side in one Fleet.
Each node is traced and pushed as in ``bench/detection.py`` (its own tracer phase, rows
written up to ``--late`` s after their interval, fleet-push's own window, sampler,
detection selector and classifier, the push carrying its NCCL communicators as the
collectives reader builds them from the node DB's rows); Fleet is ``FleetState`` with its
NCCL join; the reply's peer lag and NCCL episode go back to the node as in the agent.

Scenarios, each ``--runs`` seeded runs, the cause on one rank of job 0 after ``--warmup``
s (the others healthy):

- ``host``: its host 20% slower (CPU contention); ``gpu``: its GPU 10% slower, NVML silent;
  ``throttle``: its GPU throttled 20% (NVML's thermal reason, a lower clock); each from
  the moment of the injection, mid-step;
  ``birth``: its host 20% slower from the job's first step (its latency counts from the
  job's start: its ranks' warm-up and its group's quorum come first);
- ``hang``: it stops before its next collective (its peers enter it and wait);
- ``stuck``: the collective in flight never completes on any rank (none missing);
- ``phase``: every rank of job 0 30% slower at once.
- ``pause``: it pauses once, ``--pause`` s (0.5) before its next collective (a GC, a
  checkpoint it writes alone), then goes on: no straggler.

Per scenario: the straggler's detection latency (s from the injection to the first event
naming it a straggler: a ``straggler_state``, node's or Fleet's, or Fleet's ``peer_lag``;
p50, p95, max, misses); for ``hang``
the time from the peers' arrival at the held collective to the first event naming the
missing rank (any type) and to ``collective_hang``; false straggler episodes per
node-hour, counted apart for the ranks of job 0 (a straggler's or a hang's victims) and
for the healthy jobs; and the NCCL events seen.

    .venv/bin/python -m bench.lockstep [--jobs 8] [--ranks 8] [--runs 10]
        [--after 60] [--warmup 40] [--scenarios host,gpu,...] [--no-nvml] [--late 0]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench import detection as sim
from ingero.fleet.config import FleetConfig, ThresholdConfig
from ingero.fleet.state import FleetState
from ingero.otlp.collectives import ClockOffset, CommReport
from ingero.otlp.health import NodePush
from ingero.push.collectives import build_reports
from ingero.push.config import ClassifierConfig, PushConfig
from ingero.push.sampler import NodeSample
from ingero.push.waiting import FleetNccl, lockstep, with_peers
from ingero.runtime.clock import ManualClock
from ingero.runtime.config import Duration
from ingero.schema.events import Event
from ingero.workload.lockstep import JobProfile, LockstepJob

PUSH = 1.0
SCENARIOS = ("host", "gpu", "throttle", "birth", "hang", "stuck", "phase", "pause")
# The injected cause of each straggler scenario: (slowdown, cause).
SLOW = {"host": (0.2, "cpu"), "gpu": (0.1, "gpu"), "throttle": (0.2, "throttle"),
        "birth": (0.2, "cpu")}  # fmt: skip
TARGET_RANK = 5  # the straggler's rank in job 0


class Options:
    jobs = 8
    ranks = 8
    nvml = True
    pause = 0.5  # s: the pause scenario's one-off pause of a rank


class RankNode(sim.SimNode):
    """One rank of a lock-step job on its own node: the job's rows, and its NCCL rows
    read as fleet-push's collectives reader reads them."""

    def __init__(
        self, job: LockstepJob, job_index: int, rank: int, seed: int, clock: ManualClock,
        config: PushConfig,
    ) -> None:  # fmt: skip
        super().__init__(job_index * 100 + rank, job.profile.shape, 0.0, seed, clock, config)
        self.name = f"j{job_index}r{rank}"
        self.job, self.job_index, self.job_rank = job, job_index, rank
        self.job_id = f"{sim.JOB}{job_index}"
        self.pushed_upto = 0.0  # rows visible at the last push (their ``at``)
        self.last_comm: dict[str, Any] | None = None

    def trace(self, now: float) -> None:
        while self.tracer_end + sim.Timing.tracer <= now and not self.ended:
            start, self.tracer_end = self.tracer_end, self.tracer_end + sim.Timing.tracer
            at = self.tracer_end + self.rng.uniform(0.0, sim.Timing.late)
            rows = self.job.rows(self.job_rank, start, self.tracer_end)
            if not Options.nvml:
                rows.gpu_intervals, rows.gpu_processes = [], []
            self.written.append(sim.Written(start, self.tracer_end, at, rows))
        horizon = now - (4 + 2) * sim.Timing.push - sim.Timing.tracer
        while self.written and self.written[0].ts_end < horizon:
            self.written.pop(0)

    def collectives(self, now: float) -> tuple[CommReport, ...]:
        """This push's communicator, from the rows written since the last push (the newest
        comm row, the counts summed over the new ones), as ``CollectivesReader`` reads it."""
        new = [w for w in self.written if self.pushed_upto < w.at <= now]
        self.pushed_upto = max([self.pushed_upto, *(w.at for w in new)])
        comms = [c for w in new for c in w.rows.nccl_comms]  # type: ignore[attr-defined]
        if comms:
            newest = dict(comms[-1])
            for key in ("calls", "wait_ns", "dropped"):
                newest[key] = sum(int(c[key]) for c in comms)
            self.last_comm = newest
        elif self.last_comm is not None:
            self.last_comm = {**self.last_comm, "calls": 0, "wait_ns": 0, "dropped": 0}
        if self.last_comm is None:
            return ()
        calls = [c for w in new for c in w.rows.nccl_calls]  # type: ignore[attr-defined]
        return tuple(
            build_reports([self.last_comm], calls, now=now, fresh_s=PUSH, pid_alive=lambda _: True)
        )

    def lockstep_sample(self) -> NodeSample:
        now = self.clock.now()
        self.trace(now)  # the rows written by now, NCCL's with the others
        comms = self.collectives(now)
        sample = self.sample(
            waiting=any(c.inflight_seq is not None for c in comms),
            nccl=FleetNccl.of(self.reply),
            at_collective=with_peers(comms),
            lockstep=lockstep(comms),
        )
        return NodeSample(**{**sample.__dict__, "collectives": comms})

    def lockstep_push(self, sample: NodeSample) -> NodePush:
        push = self.push(sample)
        return NodePush(
            **{
                **push.__dict__,
                "job_id": self.job_id,
                "rank": self.job_rank,
                "collectives": sample.collectives,
                "clock": ClockOffset(0.0, 0.0005),
                "quiet": sample.quiet,
                "waiting": sample.waiting,
            }
        )


@dataclass
class Flag:
    """The first straggler_state of a node (s on the simulated clock) and who raised it."""

    at: float
    by: str
    reason: str | None


@dataclass
class Run:
    """What one run of one scenario saw."""

    injected: float
    target: str
    first: dict[str, Flag] = field(default_factory=dict)  # node -> its first flag
    episodes: dict[str, set[str]] = field(default_factory=dict)  # node -> episode ids
    nccl: list[Event] = field(default_factory=list)
    arrived: float | None = None  # hang/stuck: the peers' first arrival at the held collective
    seconds: float = 0.0


class LockstepSim:
    def __init__(self, seed: int, config_changes: dict[str, Any] | None = None) -> None:
        self.clock = ManualClock()
        self.clock.advance(1_800_000_000.0 - self.clock.now())
        self.fleet = FleetState(
            FleetConfig(
                push_interval=Duration(PUSH),
                threshold=ThresholdConfig(),
                **(config_changes or {}),
            ),
            self.clock,
        )
        config = PushConfig(classifier=ClassifierConfig())
        # Every node's tracer and agent start within the first push interval (each at its
        # own moment, sim.SimNode); the jobs start after them, at a phase of their own, as
        # a job starts on nodes whose ingero runs already (a tracer that starts after the
        # job's first collectives never sees them, and the bench would measure that).
        start = self.clock.now() + max(sim.Timing.tracer, PUSH)
        self.jobs = [
            LockstepJob(
                JobProfile(ranks=Options.ranks, job_id=f"{sim.JOB}{j}", pid=1000 + 100 * j),
                start=start + random.Random(seed * 31 + j).uniform(0, 1),
                seed=seed * 100 + j,
            )
            for j in range(Options.jobs)
        ]
        self.nodes = [
            RankNode(job, j, r, seed, self.clock, config)
            for j, job in enumerate(self.jobs)
            for r in range(Options.ranks)
        ]
        self.node_events: list[Event] = []
        self.fleet_events: list[Event] = []
        self.nccl_events: list[Event] = []
        self.next_tick = self.clock.now() + PUSH

    def step(self) -> None:
        """The pushes up to the next tick, and Fleet's tick."""
        self.pushes(self.next_tick)
        self.next_tick += PUSH
        tick = self.fleet.tick()
        self.fleet_events += [e for e in tick.events if e.type.startswith("straggler")]
        self.nccl_events += [
            e for e in tick.events if e.type in ("peer_lag", "collective_hang", "collective_wait")
        ]

    def pushes(self, end: float) -> None:
        """Every node's pushes up to ``end`` (the clock then at ``end``)."""
        while True:
            node = min(self.nodes, key=lambda n: n.next_push)
            if node.next_push > end:
                break
            self.clock.advance(node.next_push - self.clock.now())
            node.next_push += PUSH * (1 + node.rng.uniform(-sim.Timing.jitter, sim.Timing.jitter))
            sample = node.lockstep_sample()
            push = node.lockstep_push(sample)
            if sample.held and sample.result is None:
                continue
            view = self.fleet.ingest(push)
            events = node.classify(push, sample, view, lag=True)
            self.node_events += [e for e in events if e.type.startswith("straggler")]
        self.clock.advance(end - self.clock.now())


def run_scenario(name: str, seed: int, warmup: float, after: float) -> Run:
    s = LockstepSim(seed)
    job = s.jobs[0]
    if name == "birth":
        slowdown, cause = SLOW[name]
        job.set_slowdown(TARGET_RANK, slowdown, cause)
    for _ in range(int(warmup / PUSH)):
        s.step()
    # The cause comes at its own moment between two of Fleet's ticks (a latency measured
    # from a tick would leave out the wait for the tick after the evidence is in).
    s.pushes(s.clock.now() + random.Random(seed * 7 + 3).uniform(0, PUSH))
    mark = (len(s.node_events), len(s.fleet_events), len(s.nccl_events))
    now = s.clock.now()
    for node in s.nodes:
        node.trace(now)  # the rows up to now as they were: a change applies after it
    if name in SLOW and name != "birth":
        slowdown, cause = SLOW[name]
        job.set_slowdown(TARGET_RANK, slowdown, cause, at=now)
    elif name == "hang":
        job.hang(TARGET_RANK, now)
    elif name == "stuck":
        job.stuck(now)
    elif name == "phase":
        job.phase(0.3)
    resume = None
    if name == "pause":
        # Its next collective, Options.pause s late (a collection of Python's GC, a
        # checkpoint written by one rank): the others wait for it once, then go on.
        job.hang(TARGET_RANK, now)
        job._advance(now + 2 * job.profile.step_s)  # the step it stops in
        held = job._held
        assert held is not None
        spans = held.spans[TARGET_RANK]
        resume = (spans[-1][1] if spans else held.start) + Options.pause
    run = Run(injected=now, target=f"j0r{TARGET_RANK}")
    for _ in range(int(after / PUSH)):
        if resume is not None and resume <= s.next_tick:
            s.pushes(resume)
            job.release(resume)
            resume = None
        s.step()
    if name == "birth":
        # Slow from its first step: counted from the job's start (its ranks' warm-up and
        # its group's quorum included).
        mark, run.injected = (0, 0, 0), job.start
    held = job._held
    if held is not None and name != "pause":
        arrivals = [a for r, per in enumerate(held.arrivals) for a in per
                    if a != float("inf") and a > now and r != TARGET_RANK]  # fmt: skip
        run.arrived = min(arrivals) if arrivals else None
    for by, events in (("node", s.node_events[mark[0] :]), ("fleet", s.fleet_events[mark[1] :])):
        for e in events:
            if e.type != "straggler_state":
                continue
            run.episodes.setdefault(e.node_id, set()).add(e.event_id)
            first = run.first.get(e.node_id)
            if first is None or e.timestamp < first.at:
                run.first[e.node_id] = Flag(e.timestamp, by, e.extra.get("reason"))
    run.nccl = s.nccl_events[mark[2] :]
    for e in run.nccl:  # Fleet's peer_lag names the late rank as a straggler too
        if e.type == "peer_lag" and e.extra.get("state") == "start":
            first = run.first.get(e.node_id)
            if first is None or e.timestamp < first.at:
                run.first[e.node_id] = Flag(e.timestamp, "fleet", "peer_lag")
    run.seconds = s.clock.now() - run.injected
    return run


def pct(values: list[float], q: float) -> float:
    return sim.percentile(values, q)


def figures(values: list[float], runs: int) -> str:
    if not values:
        return f"none in {runs} runs"
    return (
        f"p50 {statistics.median(values):.1f} s, p95 {pct(values, 0.95):.1f} s, "
        f"max {max(values):.1f} s ({len(values)}/{runs} runs)"
    )


def report(name: str, runs: list[Run]) -> None:
    n = len(runs)
    target = runs[0].target
    victims = [f"j0r{r}" for r in range(Options.ranks) if f"j0r{r}" != target]
    healthy_nodes = (Options.jobs - 1) * Options.ranks
    seconds = sum(r.seconds for r in runs)
    victim_hours = len(victims) * seconds / 3600
    healthy_hours = healthy_nodes * seconds / 3600
    if name in ("stuck", "phase"):
        victims, victim_hours = [*victims, target], (len(victims) + 1) * seconds / 3600
    false_victims = sum(len(r.episodes.get(v, ())) for r in runs for v in victims)
    false_healthy = sum(
        len(ids) for r in runs for node, ids in r.episodes.items() if not node.startswith("j0r")
    )
    flagged_victims = sum(any(v in r.first for v in victims) for r in runs)
    line = f"{name:9s}"
    if name == "pause":  # a one-off pause of a rank makes no straggler
        episodes = sum(len(r.episodes.get(target, ())) for r in runs)
        lags = sum(
            e.type == "peer_lag" and e.node_id == target and not e.extra.get("repeat")
            for r in runs
            for e in r.nccl
            if e.extra.get("state") == "start"
        )
        flagged = sum(target in r.first for r in runs)
        line += (
            f" {Options.pause:g} s pause: the paused rank flagged in {flagged}/{n} runs"
            f" ({episodes} straggler_state episodes, {lags} peer_lag)"
        )
    if name in SLOW or name == "hang":
        lat = [r.first[target].at - r.injected for r in runs if target in r.first]
        line += f" straggler flagged: {figures(lat, n)}"
        reasons = sorted(
            {f"{r.first[target].reason or 'score'}" for r in runs if target in r.first}
        )
        line += f" ({'/'.join(reasons)})"
    if name in ("hang", "stuck"):
        named, hangs = [], []
        for r in runs:
            if r.arrived is None:
                continue
            starts = [e for e in r.nccl if e.extra.get("state") == "start"]
            hang = [e.timestamp - r.arrived for e in starts if e.type == "collective_hang"]
            if hang:
                hangs.append(min(hang))
            naming = [
                e.timestamp - r.arrived
                for e in starts
                if e.job_id == f"{sim.JOB}0"
                and (
                    name == "stuck"
                    or e.node_id == target
                    or target in e.extra.get("missing_nodes", [])
                )
            ]
            if naming:
                named.append(min(naming))
        what = "missing rank named" if name == "hang" else "job-level event"
        line += f"; {what} after the peers' arrival: {figures(named, n)}"
        line += f"; collective_hang: {figures(hangs, n)}"
    line += (
        f"; false episodes per node-hour: victims {false_victims / victim_hours:.3g}"
        f" ({false_victims} in {victim_hours:.2f} h, runs with one {flagged_victims}/{n}),"
        f" healthy jobs {false_healthy / max(healthy_hours, 1e-9):.3g}"
        f" ({false_healthy} in {healthy_hours:.1f} h)"
    )
    kinds: dict[str, int] = {}
    for r in runs:
        for e in r.nccl:
            if e.extra.get("state") == "start" and not e.extra.get("repeat"):
                kinds[e.type] = kinds.get(e.type, 0) + 1
    line += "; NCCL events " + (", ".join(f"{k}={v}" for k, v in sorted(kinds.items())) or "none")
    print(line, flush=True)


def main(argv: list[str] | None = None, on_run: Callable[[str, Run], None] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--lockstep", action="store_true")
    parser.add_argument("--jobs", type=int, default=Options.jobs)
    parser.add_argument("--ranks", type=int, default=Options.ranks)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=float, default=40.0, help="s before the injection")
    parser.add_argument("--after", type=float, default=60.0, help="s watched after it")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--no-nvml", action="store_true")
    parser.add_argument("--pause", type=float, default=Options.pause, help="s, pause scenario")
    parser.add_argument("--late", type=float, default=0.0)
    parser.add_argument("--tracer-interval", type=float, default=1.0)
    args = parser.parse_args(argv)
    Options.jobs, Options.ranks, Options.nvml = args.jobs, args.ranks, not args.no_nvml
    Options.pause = args.pause
    sim.Timing.push, sim.Timing.tracer, sim.Timing.late = PUSH, args.tracer_interval, args.late
    import logging

    logging.getLogger("ingero").setLevel(logging.ERROR)
    names = [n for n in args.scenarios.split(",") if n]
    print(
        f"== lock-step: {Options.jobs} jobs of {Options.ranks} ranks (one a node), push "
        f"{PUSH:g} s (±{sim.Timing.jitter:.0%}), tracer interval {sim.Timing.tracer:g} s, "
        f"rows up to {sim.Timing.late:g} s late, "
        + ("NVML rows" if Options.nvml else "no GPU rows")
        + f", {args.runs} runs a scenario, {args.warmup:g} s warm-up, {args.after:g} s after",
        flush=True,
    )
    began = time.monotonic()
    for name in names:
        runs = []
        for seed in range(args.runs):
            run = run_scenario(name, seed, args.warmup, args.after)
            runs.append(run)
            if on_run is not None:
                on_run(name, run)
        report(name, runs)
    print(f"({time.monotonic() - began:.0f} s of CPU time on this host)", flush=True)


if __name__ == "__main__":
    main()
