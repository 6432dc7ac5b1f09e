"""Links and chains: a cause and its effect line up in time and by process; one chain per rule."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ingero.explain.chains.rules import Rule
from ingero.explain.chains.signal import Signal
from ingero.explain.chains.timeline import Timeline


@dataclass(frozen=True)
class Link:
    """``cause`` leads to ``effect``: how well they line up, and why."""

    cause: str
    effect: str
    confidence: float
    time: str
    process: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "effect": self.effect,
            "confidence": round(self.confidence, 2),
            "time": self.time,
            "process": self.process,
        }


def _step(s: Signal) -> dict[str, Any]:
    return {
        "signal": s.id,
        "layer": s.layer,
        "text": s.text,
        "onset": s.onset,
        "pids": None if s.pids is None else sorted(s.pids),
        "evidence": s.evidence,
        "call_sites": [c.as_dict() for c in s.sites],
    }


def _with_site(s: Signal) -> str:
    return f"{s.text} ← {s.sites[0].text()}" if s.sites else s.text


@dataclass(frozen=True)
class Chain:
    """Causes (together) -> the CUDA/NCCL change that carries them -> the throughput drop."""

    rule: str
    name: str
    confidence: float
    causes: tuple[Signal, ...]
    via: Signal | None
    effect: Signal | None
    links: tuple[Link, ...]
    fix: str
    missing: tuple[str, ...] = ()  # layers the rule expects that were not found

    @property
    def level(self) -> str:
        return confidence_level(self.confidence)

    def headline(self) -> str:
        """Effect first, as a person reads it: ``launch rate down ← … ← cause``."""
        parts = [_with_site(s) for s in (self.effect, self.via) if s is not None]
        parts.append(" + ".join(_with_site(s) for s in self.causes))
        return " ← ".join(parts) + f" ← {self.name}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "name": self.name,
            "confidence": round(self.confidence, 2),
            "level": self.level,
            "headline": self.headline(),
            "causes": [_step(s) for s in self.causes],
            "via": None if self.via is None else _step(self.via),
            "effect": None if self.effect is None else _step(self.effect),
            "links": [link.as_dict() for link in self.links],
            "missing": list(self.missing),
            "fix": self.fix,
        }


def confidence_level(value: float) -> str:
    return "high" if value >= 0.6 else "medium" if value >= 0.35 else "low"


def _correlation(a: Mapping[float, float], b: Mapping[float, float]) -> float | None:
    common = sorted(set(a) & set(b))
    if len(common) < 4:
        return None
    xs, ys = [a[k] for k in common], [b[k] for k in common]
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:  # a constant series
        return None


def link(cause: Signal, effect: Signal, tick_s: float) -> Link:
    """How well ``cause`` lines up with ``effect`` in time and by process (0..1)."""
    # Time: the cause should start no later than one interval after the effect (a flush
    # boundary can split them), and the per-interval series should move together: the
    # same direction when both rise, opposite when the effect is a drop.
    score_t, notes = 0.7, []
    if cause.onset is not None and effect.onset is not None:
        lag = effect.onset - cause.onset
        aligned = lag >= -tick_s * 1.01
        score_t = 0.9 if aligned else 0.4
        notes.append(
            f"{cause.id} began {abs(lag):.0f} s {'before' if lag >= 0 else 'after'} {effect.id}"
            if lag
            else f"{cause.id} and {effect.id} began in the same interval"
        )
    r = _correlation(cause.series, effect.series)
    if r is not None:
        same_way = r if cause.rising == effect.rising else -r
        score_t = min(1.0, max(0.2, score_t + 0.3 * same_way))
        notes.append(f"per-interval correlation {same_way:+.2f}")
    if not notes:
        notes.append("no per-interval timing to compare")
    # Process: the same PIDs on both ends; a node-wide end cannot be tied to a process.
    if cause.pids is not None and effect.pids is not None:
        shared = cause.pids & effect.pids
        score_p = 1.0 if shared else 0.5
        process = (
            f"same process: pid {', '.join(map(str, sorted(shared)[:5]))}"
            if shared
            else "different processes"
        )
    else:
        score_p = 0.85
        process = "node-wide: not tied to one process"
    return Link(cause.id, effect.id, score_t * score_p, "; ".join(notes), process)


def _tick_s(t: Timeline) -> float:
    ticks = sorted({r.ts_end for r in t.ops} | {h.ts_end for h in t.host})
    gaps = [b - a for a, b in itertools.pairwise(ticks) if b > a]
    return statistics.median(gaps) if gaps else 0.0


def build_chains(t: Timeline, rules: Sequence[Rule], found: Mapping[str, Signal]) -> list[Chain]:
    """One chain per rule whose cause is present and not explained better by another rule."""
    tick = _tick_s(t)
    chains = []
    for rule in rules:
        if rule.cause_all and not all(s in found for s in rule.cause_all):
            continue
        if rule.cause_any and not any(s in found for s in rule.cause_any):
            continue
        if any(s in found for s in rule.unless_any):
            continue
        causes = [found[s] for s in (*rule.cause_all, *rule.cause_any) if s in found]
        if any(c.id not in rule.via_any for c in causes):
            # A signal the rule also lists as `via` carries a stronger cause found beside it.
            causes = [c for c in causes if c.id not in rule.via_any]
        used = {s.id for s in causes}
        candidates = [found[s] for s in rule.via_any if s in found and s not in used]
        via = max(candidates, key=lambda s: s.strength) if candidates else None
        effect = next((found[s] for s in rule.effect_any if s in found and s not in used), None)
        # Every cause leads to the next layer found (the via change, else the effect).
        nxt = via or effect
        links = [link(c, nxt, tick) for c in causes] if nxt is not None else []
        if via is not None and effect is not None:
            links.append(link(via, effect, tick))
        missing = []
        confidence = rule.prior * (min(lk.confidence for lk in links) if links else 0.5)
        if rule.via_any and via is None:
            missing.append("via")
            confidence *= 0.8
        if rule.effect_any and effect is None:
            missing.append("effect")
            confidence *= 0.6
        chains.append(
            Chain(
                rule.id,
                rule.name,
                confidence,
                tuple(causes),
                via,
                effect,
                tuple(links),
                rule.fix,
                tuple(missing),
            )
        )
    chains.sort(key=lambda c: (-c.confidence, c.rule))
    return chains
