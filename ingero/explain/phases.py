"""Which of the job's marked phases a chain's evidence falls in (pure).

A chain's signals say when (from the start of their onset interval to the end of the window) and which processes (their
PIDs; None: node-wide, like block I/O). A phase the job marked through ``ingero annotate``
(``checkpoint``, ``evaluate``) overlaps that time on one of those processes, or on any for a
node-wide signal: "checkpoint (rank 5, pid 4000): 41 s of block I/O up".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from ingero.explain.chains.signal import Signal

# Phases read for one explain window: the latest, so a job marking thousands stays bounded.
MAX_PHASES: Final = 1000
# Phases named per chain, the longest overlap first.
PHASES_PER_CHAIN: Final = 3


@dataclass(frozen=True)
class Phase:
    name: str
    pid: int
    rank: int | None
    start: float
    end: float | None  # None: still open (or the job ended inside it)


@dataclass(frozen=True)
class PhaseOverlap:
    phase: Phase
    signal: str  # the signal's id
    text: str  # the signal's text
    overlap_s: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "phase": self.phase.name,
            "pid": self.phase.pid,
            "rank": self.phase.rank,
            "start": self.phase.start,
            "end": self.phase.end,
            "signal": self.signal,
            "overlap_s": round(self.overlap_s, 3),
        }

    def line(self) -> str:
        who = (f"rank {self.phase.rank}, " if self.phase.rank is not None else "") + (
            f"pid {self.phase.pid}"
        )
        return f"in phase {self.phase.name} ({who}): {self.overlap_s:.0f} s of {self.text}"


def phases_of(signals: Iterable[Signal], phases: Iterable[Phase], end: float) -> list[PhaseOverlap]:
    """The phases the signals' evidence (onset to ``end``) falls in, longest overlap first."""
    phases = list(phases)
    found: dict[tuple[str, int, float], PhaseOverlap] = {}
    for signal in signals:
        if signal.onset is None:
            continue
        # The onset is the end of the first interval past the baseline: the evidence
        # begins where that interval began (the end of the one before).
        before = [ts for ts in signal.series if ts < signal.onset]
        begins = max(before) if before else signal.onset
        for phase in phases:
            if signal.pids is not None and phase.pid not in signal.pids:
                continue
            overlap = min(end, phase.end if phase.end is not None else end) - max(
                begins, phase.start
            )
            key = (phase.name, phase.pid, phase.start)
            if overlap > 0 and (key not in found or found[key].overlap_s < overlap):
                found[key] = PhaseOverlap(phase, signal.id, signal.text, overlap)
    ranked = sorted(found.values(), key=lambda p: (-p.overlap_s, p.phase.start))
    return ranked[:PHASES_PER_CHAIN]
