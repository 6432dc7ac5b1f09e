"""Downsampling Fleet's live scores into the per-node history Echo keeps.

Fleet holds only each node's latest score. Every ``interval`` seconds :class:`ScoreHistory`
takes one sample of each active or idle node that pushed since the previous sample (a
silent node's old score is not repeated until it expires), stamped with the sampling time.
Pure: it takes the rows and an injected clock; the daemon hands the samples to the Echo
forwarder (``ingero.fleet.forwarder``), which encodes them with
:func:`ingero.otlp.health.encode_score_history` and sends them off the tick thread. On the
wire a sample is a health push's resource and score point, so Echo decodes it like any other.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from ingero.fleet.state import NodeScore
from ingero.runtime.clock import Clock


class ScoreSample(NamedTuple):
    """One node's score at one moment: a point of its history, as
    :func:`ingero.otlp.health.encode_score_history` sends it to Echo."""

    node: NodeScore
    time_unix_nano: int


class ScoreHistory:
    """Decides when a sample is due and which nodes it holds."""

    def __init__(self, interval: float, clock: Clock) -> None:
        if interval <= 0:
            raise ValueError(f"the score history interval must be positive, got {interval!r}")
        self.interval = interval
        self._clock = clock
        self._next: float | None = None  # None: the first call samples at once
        self._last: float | None = None

    def due(self) -> bool:
        return self._next is None or self._clock.monotonic() >= self._next

    def take(self, nodes: Iterable[NodeScore]) -> list[ScoreSample]:
        """The samples of the nodes that pushed since the previous ``take``; schedules the
        next one an interval later (from now, after a stall, rather than catching up)."""
        mono = self._clock.monotonic()
        ns = int(self._clock.now() * 1e9)
        last = self._last
        samples = [ScoreSample(node, ns) for node in nodes if last is None or node.seen > last]
        self._last = mono
        nxt = (self._next or mono) + self.interval
        self._next = nxt if nxt > mono else mono + self.interval
        return samples
