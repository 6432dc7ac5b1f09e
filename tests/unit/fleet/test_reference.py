"""FleetState against a plain-Python reference of the DESIGN.md rules over random histories.

The reference keeps one dict per node and recomputes every group with ``statistics``; it
shares no code with the vectorised engine. Random pushes (some held: the node's last
measurement again; some from agents that do not say), state changes, job moves and silences (expiry) are replayed through
both, tick by tick, and every figure, verdict and event must agree.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field

import pytest

from ingero.fleet.config import FleetConfig, ThresholdConfig
from ingero.fleet.model import TickResult
from ingero.fleet.state import FleetState
from ingero.fleet.threshold import NOISE_ALPHA
from ingero.otlp.health import NodePush
from ingero.runtime.clock import ManualClock

INTERVAL = 5.0
SCORES = [0.9, 0.91, 0.89, 0.92, 0.88, 0.86, 0.85, 0.84, 0.3, 0.5, 0.7]


@dataclass
class RefNode:
    score: float
    active: bool
    group: str
    seen: float
    straggler: bool = False
    episode_group: str | None = None
    consec: int = 0
    since: float | None = None
    # Whether the score was below the threshold, the last active ticks outside an episode
    # at which the node had pushed a new measurement.
    recent: list[bool] = field(default_factory=list)
    # In an episode: the measured ticks in a row at threshold + hysteresis or above.
    above: int = 0
    fresh: bool = True  # a push since the last tick that did not hold
    says: bool = True  # the last push said whether it held (else every tick counts)
    # The score of the last measurement counted, the mean change from one to the next
    # (exponentially weighted) and the group they were measured in.
    last: float | None = None
    noise: float | None = None
    changes: int = 0
    noise_group: str | None = None


@dataclass
class Reference:
    config: FleetConfig
    nodes: dict[str, RefNode] = field(default_factory=dict)
    ema: dict[str, float] = field(default_factory=dict)
    panic: dict[str, bool] = field(default_factory=dict)

    def push(
        self, node: str, score: float, active: bool, group: str, mono: float, held: bool | None
    ) -> None:
        ref = self.nodes.get(node)
        if ref is None:
            ref = self.nodes[node] = RefNode(score, active, group, mono, fresh=False)
        ref.score, ref.active, ref.group, ref.seen = score, active, group, mono
        ref.fresh = ref.fresh or held is False
        ref.says = held is not None

    def tick(
        self, now: float, mono: float
    ) -> tuple[dict[str, float | None], dict[str, float | None], set[tuple]]:
        t, q = self.config.threshold, self.config.quorum
        events: set[tuple] = set()
        for name in [n for n, r in self.nodes.items() if mono - r.seen >= self.config.node_ttl]:
            if self.nodes[name].straggler:
                events.add(("straggler_resolved", name, "expired", None))
            del self.nodes[name]
        live = {r.group for r in self.nodes.values()}
        for gone in set(self.ema) - live:
            del self.ema[gone]
        for gone in set(self.panic) - live:
            del self.panic[gone]
        for r in self.nodes.values():
            if r.group != r.noise_group:  # another job's scores say nothing of this one's
                r.last, r.noise, r.changes, r.noise_group = None, None, 0, r.group
            if r.active and (r.fresh or not r.says):
                if r.last is not None:
                    change = abs(r.score - r.last)
                    r.changes += 1
                    weight = max(1.0 / r.changes, NOISE_ALPHA)  # a plain mean at first
                    r.noise = change if r.noise is None else r.noise + weight * (change - r.noise)
                r.last = r.score
        thresholds: dict[str, float | None] = {}
        noise_of: dict[str, float | None] = {}
        quorum: dict[str, bool] = {}
        panic: dict[str, bool] = {}
        for group in live:
            members = [r.score for r in self.nodes.values() if r.group == group and r.active]
            quorum[group] = len(members) >= q.statistical_min
            if not members:
                thresholds[group] = noise_of[group] = None
                panic[group] = False
                continue
            med = statistics.median(members)
            mad = statistics.median([abs(v - med) for v in members])
            noises = [
                r.noise
                for r in self.nodes.values()
                if r.group == group and r.active and r.noise is not None
            ]
            noise_of[group] = statistics.median(noises) if noises else None
            noise = t.noise_k * statistics.median(noises) if noises else 0.0
            raw = max(0.0, med - max(t.k * 1.4826 * mad, t.min_margin, noise))
            if quorum[group]:
                prev = self.ema.get(group)
                smoothed = raw if prev is None else t.ema_alpha * raw + (1 - t.ema_alpha) * prev
                self.ema[group] = smoothed
                thresholds[group] = smoothed
            else:
                self.ema.pop(group, None)
                thresholds[group] = raw
            below = sum(v < thresholds[group] for v in members)  # type: ignore[operator]
            panic[group] = quorum[group] and below / len(members) > t.panic_fraction
            if panic[group] and not self.panic.get(group, False):
                events.add(("group_degraded", "", group, True))
        self.panic = panic
        for name, r in self.nodes.items():
            here = r.straggler and r.episode_group == r.group
            thr = thresholds[r.group]
            below = r.active and quorum[r.group] and thr is not None and r.score < thr
            counted = r.fresh or not r.says
            if r.active and counted:
                r.recent = [*r.recent, below][-max(t.enter_window, t.enter_intervals) :]
            elif not r.active:
                r.recent = []
            enters = counted and sum(r.recent) >= t.enter_intervals
            if here and r.active and counted:
                up = thr is not None and r.score >= thr + t.hysteresis
                r.above = r.above + 1 if up else 0
            r.fresh = False
            now_straggler = (
                r.active
                and quorum[r.group]
                and thr is not None
                and ((r.score < thr and (here or enters)) or (here and r.above < t.exit_intervals))
            )
            if not (now_straggler and here):
                r.above = 0
            if r.straggler and not (now_straggler and here):
                if not r.active:
                    reason = "inactive"
                elif r.group != r.episode_group:
                    reason = "group_changed"
                elif not quorum[r.group]:
                    reason = "quorum_lost"
                else:
                    reason = "recovered"
                judged_in = r.group if reason in ("recovered", "quorum_lost") else r.episode_group
                events.add(("straggler_resolved", name, reason, panic.get(str(judged_in), False)))
            if now_straggler and not here:
                events.add(("straggler_state", name, (r.group, thr), panic[r.group]))
                r.consec, r.since = 1, now
            elif now_straggler:
                r.consec += 1
            else:
                r.consec, r.since = 0, None
            if now_straggler:
                r.recent = []
            r.straggler = now_straggler
            r.episode_group = r.group if now_straggler else None
        return thresholds, noise_of, events


def observed(result: TickResult) -> set[tuple]:
    out: set[tuple] = set()
    for e in result.events:
        if e.type == "straggler_resolved":
            expired = e.extra["reason"] == "expired"
            out.add((e.type, e.node_id, e.extra["reason"], None if expired else e.extra["panic"]))
        elif e.type == "straggler_state":
            out.add((e.type, e.node_id, (e.extra["group"], e.threshold), e.extra["panic"]))
        else:
            out.add((e.type, e.node_id, e.extra["group"], e.extra["panic"]))
    return out


@pytest.mark.parametrize("seed", range(25))
def test_random_histories_match_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    config = FleetConfig(
        threshold=ThresholdConfig(
            ema_alpha=rng.choice([1.0, 0.5, 0.2]),
            enter_intervals=rng.choice([1, 2, 3]),
            enter_window=rng.choice([1, 2, 3, 5]),
            exit_intervals=rng.choice([1, 2, 3]),
            # Random scores vary far more than a job's: 3 (the default) makes the noise
            # the margin most of the time, 0 never, 0.3 now and then.
            noise_k=rng.choice([0.0, 0.3, 3.0]),
        )
    )
    clock = ManualClock()
    state = FleetState(config, clock)
    ref = Reference(config)
    names = [f"n{i}" for i in range(rng.randint(6, 16))]
    jobs = ["1", "2", "3"]
    home = {n: rng.choice(jobs[:2]) for n in names}
    says = {n: rng.random() < 0.7 for n in names}  # the others: older agents
    episode_ids: dict[str, str] = {}
    for _ in range(30):
        for name in names:
            if rng.random() < 0.15:
                continue  # silent this interval; long silences expire
            if rng.random() < 0.03:
                home[name] = rng.choice(jobs)
            score = rng.choice(SCORES) if rng.random() < 0.8 else rng.random()
            # A held push repeats the node's last measurement.
            held = says[name] and name in ref.nodes and rng.random() < 0.2
            score = ref.nodes[name].score if held else score
            active = rng.random() < 0.9
            push = NodePush(
                node_id=name,
                cluster_id="c",
                score=score,
                job_id=home[name],
                state="active" if active else "idle",
                held=held if says[name] else None,
            )
            state.ingest(push)
            ref.push(name, score, active, push.group, clock.monotonic(), push.held)
        result = state.tick()
        thresholds, noise, events = ref.tick(clock.now(), clock.monotonic())
        assert {g.group: g.threshold for g in result.groups} == thresholds
        assert {g.group: g.noise for g in result.groups} == noise
        assert observed(result) == events
        expected = {n: (r.consec, r.since) for n, r in ref.nodes.items() if r.straggler}
        got = {v.node_id: (v.consecutive_straggler_ticks, v.since) for v in result.verdicts}
        assert got == expected
        for e in result.events:  # both events of an episode share its id
            if e.type == "straggler_state":
                episode_ids[e.node_id] = e.event_id
            elif e.type == "straggler_resolved":
                assert episode_ids.pop(e.node_id) == e.event_id
        clock.advance(INTERVAL * rng.choice([1, 1, 1, 2, 3]))
