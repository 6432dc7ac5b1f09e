"""Which threshold a node classifies itself against: the detection mode (pure, fail-open).

Modes, best first, each with an explicit age limit (``DetectionConfig``):

- ``fleet``: Fleet's threshold with quorum, received at most ``fleet_max_age`` ago;
- ``fleet-cached``: the last such threshold, kept in memory, at most ``fleet_cached_max_age`` old;
- ``local-cached``: the last such threshold persisted on disk (survives restarts), at most
  ``local_cached_max_age`` old by the wall clock;
- ``local-baseline``: the node's own score EMA minus ``local_margin``, once warmed up;
- ``none``: nothing to compare with; the node is not classified.

A mode change is reported once (``Decision.transition``), so the agent logs it and emits one
``detection_mode`` event per change, never one per interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from ingero.otlp.threshold import ThresholdView
from ingero.push.config import DetectionConfig
from ingero.runtime.clock import Clock

Mode = Literal["fleet", "fleet-cached", "local-cached", "local-baseline", "none"]
# The modes whose threshold Fleet drew from the node's peers (fresh or kept in memory).
FLEET_MODES: tuple[Mode, ...] = ("fleet", "fleet-cached")


@dataclass(frozen=True)
class CachedThreshold:
    """A Fleet threshold with quorum, as kept in memory and persisted in the state dir."""

    threshold: float
    received_wall: float  # epoch seconds: comparable across restarts
    received_mono: float | None = None  # None when loaded from disk (a previous process)


@dataclass(frozen=True)
class Decision:
    mode: Mode
    threshold: float | None
    panic: bool
    transition: tuple[Mode | None, Mode] | None  # (previous, new) on a change, else None


@dataclass
class LocalBaseline:
    """EMA of the node's own active scores; a straggling score does not pull it down."""

    ema: float | None = None
    samples: int = 0

    def threshold(self, margin: float, warmup: int) -> float | None:
        if self.ema is None or self.samples < warmup:
            return None
        return max(0.0, self.ema - margin)

    def update(self, score: float, alpha: float, margin: float, warmup: int) -> None:
        current = self.threshold(margin, warmup)
        if current is not None and score < current:
            return
        self.ema = score if self.ema is None else self.ema + alpha * (score - self.ema)
        self.samples += 1


class DetectionSelector:
    """Picks the mode and threshold each interval from what Fleet said and what is cached."""

    def __init__(
        self,
        config: DetectionConfig,
        clock: Clock,
        persisted: CachedThreshold | None = None,
        baseline: LocalBaseline | None = None,
    ) -> None:
        self._config = config
        self._clock = clock
        self._cached = persisted
        self._panic = False
        self.baseline = baseline or LocalBaseline()
        self._mode: Mode | None = None

    @property
    def mode(self) -> Mode | None:
        return self._mode

    @property
    def cached(self) -> CachedThreshold | None:
        """The threshold to persist (changes only when Fleet sends a new one with quorum)."""
        return self._cached

    def on_fleet(self, reading: ThresholdView | None) -> bool:
        """Record a push response; True when a new threshold should be persisted."""
        if reading is None or not reading.quorum_met or reading.threshold is None:
            return False
        if not math.isfinite(reading.threshold) or not 0.0 <= reading.threshold <= 1.0:
            return False
        self._cached = CachedThreshold(
            reading.threshold, self._clock.now(), self._clock.monotonic()
        )
        self._panic = reading.panic
        return True

    def decide(self, active_score: float | None) -> Decision:
        """The mode for this interval; ``active_score`` (None unless active) feeds the baseline."""
        cfg = self._config
        mode: Mode = "none"
        threshold: float | None = None
        cached = self._cached
        if cached is not None:
            if cached.received_mono is not None:
                age = self._clock.monotonic() - cached.received_mono
                if age <= cfg.fleet_max_age:
                    mode = "fleet"
                elif age <= cfg.fleet_cached_max_age:
                    mode = "fleet-cached"
            if mode == "none":
                wall_age = self._clock.now() - cached.received_wall
                # A future-dated file (clock stepped back) is not trusted.
                if 0.0 <= wall_age <= cfg.local_cached_max_age:
                    mode = "local-cached"
            if mode != "none":
                threshold = cached.threshold
        local = self.baseline.threshold(cfg.local_margin, cfg.local_warmup)
        if mode == "none" and local is not None:
            mode, threshold = "local-baseline", local
        if active_score is not None and math.isfinite(active_score):
            self.baseline.update(
                active_score, cfg.local_ema_alpha, cfg.local_margin, cfg.local_warmup
            )
        transition = None if mode == self._mode else (self._mode, mode)
        self._mode = mode
        return Decision(mode, threshold, self._panic and mode == "fleet", transition)
