"""Persists what detection needs across restarts: Fleet's last threshold and the local EMA.

One small JSON file in the state dir, written atomically (temp + fsync + rename). A file that
is corrupt, oversized, future-dated or another node's is renamed ``*.quarantined.<ts>`` and
ignored, never trusted.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ingero.push.detection import CachedThreshold, LocalBaseline
from ingero.runtime.atomicfile import quarantine, write_atomic
from ingero.runtime.clock import Clock

log = logging.getLogger(__name__)

VERSION = 1
MAX_BYTES = 16 * 1024
CLOCK_SKEW_S = 300.0


@dataclass(frozen=True)
class DetectionState:
    cached: CachedThreshold | None
    baseline: LocalBaseline


class DetectionStore:
    def __init__(self, path: Path, node_id: str, clock: Clock) -> None:
        self.path = path
        self._node_id = node_id
        self._clock = clock

    def load(self) -> DetectionState:
        empty = DetectionState(None, LocalBaseline())
        try:
            if self.path.stat().st_size > MAX_BYTES:
                return self._quarantine("oversized", empty)
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return empty
        except (UnicodeDecodeError, ValueError):
            return self._quarantine("corrupt", empty)
        except OSError as exc:
            log.warning("cannot read %s: %s", self.path, exc.strerror)
            return empty
        try:
            return self._parse(data)
        except (KeyError, TypeError, ValueError) as exc:
            return self._quarantine(str(exc) or "malformed", empty)

    def _parse(self, data: Any) -> DetectionState:
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ValueError("unknown format")
        if data.get("node_id") != self._node_id:
            raise ValueError(f"written for node {data.get('node_id')!r}")
        cached = None
        if data.get("threshold") is not None:
            value, wall = _finite(data["threshold"]["value"]), _finite(data["threshold"]["at"])
            if not 0.0 <= value <= 1.0:
                raise ValueError("threshold outside [0, 1]")
            if wall > self._clock.now() + CLOCK_SKEW_S:
                raise ValueError("future-dated")
            cached = CachedThreshold(value, wall)
        local = data.get("local") or {}
        ema = None if local.get("ema") is None else _finite(local["ema"])
        samples = local.get("samples", 0)
        if not isinstance(samples, int) or samples < 0:
            raise ValueError("bad sample count")
        return DetectionState(cached, LocalBaseline(ema, samples))

    def _quarantine(self, reason: str, empty: DetectionState) -> DetectionState:
        target = quarantine(self.path, self._clock.now())
        log.warning("detection state %s not trusted (%s); moved to %s", self.path, reason, target)
        return empty

    def save(self, cached: CachedThreshold | None, baseline: LocalBaseline) -> None:
        data = {
            "version": VERSION,
            "node_id": self._node_id,
            "threshold": None
            if cached is None
            else {"value": cached.threshold, "at": cached.received_wall},
            "local": {"ema": baseline.ema, "samples": baseline.samples},
        }
        payload = json.dumps(data, allow_nan=False).encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, payload)


def _finite(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"not a finite number: {value!r}")
    return float(value)
