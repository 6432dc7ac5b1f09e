"""Throughput baselines: a bias-corrected EMA, persisted atomically so a restart skips warm-up.

The EMA starts at 0 and is divided by its accumulated weight ``c = 1 - prod(1 - alpha_i)`` (Adam's
bias correction; with a constant alpha this is ``1 - (1 - alpha)^n``), so the first samples are not
pulled towards 0. A file that cannot be trusted is renamed ``<name>.quarantined.<ts>`` and
ignored; the reason is logged and returned.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ingero.runtime.atomicfile import quarantine, write_atomic
from ingero.runtime.clock import Clock

log = logging.getLogger(__name__)

BASELINE_VERSION: Final = 1
MAX_FILE_BYTES: Final = 64 * 1024
# A file stamped later than now by more than this was written by a clock we cannot trust.
CLOCK_SKEW_ALLOWANCE_S: Final = 300.0


@dataclass
class EmaBaseline:
    """Bias-corrected EMA; ``alpha_down`` applies while a sample is below the current estimate."""

    alpha: float
    alpha_down: float | None = None
    ema: float = 0.0
    weight: float = 0.0
    n: int = 0

    def update(self, value: float) -> None:
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"baseline sample must be finite and >= 0, got {value!r}")
        alpha = self.alpha
        estimate = self.estimate
        if self.alpha_down is not None and estimate is not None and value < estimate:
            alpha = self.alpha_down
        self.ema = (1.0 - alpha) * self.ema + alpha * value
        self.weight = (1.0 - alpha) * self.weight + alpha
        self.n += 1

    @property
    def estimate(self) -> float | None:
        """The bias-corrected baseline, or None before the first sample."""
        if self.n == 0 or self.weight <= 0.0:
            return None
        return self.ema / self.weight

    def to_json(self) -> dict[str, float | int]:
        return {"ema": self.ema, "weight": self.weight, "n": self.n}


@dataclass
class BaselineSet:
    """All baselines of one node, as persisted."""

    node_id: str
    created: float
    updated: float
    samples: int = 0
    baselines: dict[str, EmaBaseline] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": BASELINE_VERSION,
            "node_id": self.node_id,
            "created": self.created,
            "updated": self.updated,
            "samples": self.samples,
            "baselines": {name: b.to_json() for name, b in sorted(self.baselines.items())},
        }


@dataclass(frozen=True)
class LoadResult:
    baselines: BaselineSet | None
    reason: str | None = None  # why nothing was loaded (missing or quarantined)
    quarantined_to: Path | None = None


class _Untrusted(ValueError):
    pass


def _number(data: dict[str, Any], key: str, *, integer: bool = False) -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Untrusted(f"corrupt: {key} is not a number")
    if integer and not isinstance(value, int):
        raise _Untrusted(f"corrupt: {key} is not an integer")
    if not math.isfinite(value) or value < 0:
        raise _Untrusted(f"corrupt: {key} is not a finite number >= 0")
    return float(value)


def parse_baselines(
    text: str, *, node_id: str, now: float, alpha: float, alpha_down: float | None
) -> BaselineSet:
    """Validate a baseline file's content; raises ValueError naming why it is not trusted."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _Untrusted(f"corrupt: not JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise _Untrusted("corrupt: not a JSON object")
    if data.get("version") != BASELINE_VERSION:
        raise _Untrusted(f"wrong version {data.get('version')!r} (expected {BASELINE_VERSION})")
    if data.get("node_id") != node_id:
        raise _Untrusted(f"foreign: written by node {data.get('node_id')!r}, this is {node_id!r}")
    created = _number(data, "created")
    updated = _number(data, "updated")
    if updated > now + CLOCK_SKEW_ALLOWANCE_S or created > now + CLOCK_SKEW_ALLOWANCE_S:
        raise _Untrusted(f"future-dated: updated {updated:.0f} is after now {now:.0f}")
    samples = int(_number(data, "samples", integer=True))
    raw = data.get("baselines")
    if not isinstance(raw, dict):
        raise _Untrusted("corrupt: baselines is not an object")
    baselines: dict[str, EmaBaseline] = {}
    for name, entry in raw.items():
        if not isinstance(entry, dict):
            raise _Untrusted(f"corrupt: baseline {name!r} is not an object")
        weight = _number(entry, "weight")
        if weight > 1.0:
            raise _Untrusted(f"corrupt: baseline {name!r} weight above 1")
        baselines[str(name)] = EmaBaseline(
            alpha=alpha,
            alpha_down=alpha_down,
            ema=_number(entry, "ema"),
            weight=weight,
            n=int(_number(entry, "n", integer=True)),
        )
    return BaselineSet(node_id, created, updated, samples, baselines)


class BaselineStore:
    """Loads and saves one node's baseline file (JSON, written temp + fsync + rename)."""

    def __init__(
        self,
        path: Path,
        *,
        node_id: str,
        clock: Clock,
        alpha: float,
        alpha_down: float | None = None,
    ) -> None:
        self.path = path
        self.node_id = node_id
        self.clock = clock
        self.alpha = alpha
        self.alpha_down = alpha_down

    def new(self) -> BaselineSet:
        now = self.clock.now()
        return BaselineSet(self.node_id, created=now, updated=now)

    def load(self) -> LoadResult:
        """The trusted baselines, or None with the reason (file missing or quarantined)."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return LoadResult(None, "no baseline file")
        except OSError as exc:
            return LoadResult(None, f"cannot read baseline file: {exc.strerror}")
        try:
            if size > MAX_FILE_BYTES:
                raise _Untrusted(f"oversized: {size} bytes (limit {MAX_FILE_BYTES})")
            try:
                text = self.path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise _Untrusted("corrupt: not UTF-8") from None
            except OSError as exc:
                return LoadResult(None, f"cannot read baseline file: {exc.strerror}")
            baselines = parse_baselines(
                text,
                node_id=self.node_id,
                now=self.clock.now(),
                alpha=self.alpha,
                alpha_down=self.alpha_down,
            )
        except _Untrusted as exc:
            moved = self.quarantine()
            log.warning("baseline %s not trusted (%s); moved to %s", self.path, exc, moved)
            return LoadResult(None, str(exc), moved)
        return LoadResult(baselines)

    def quarantine(self) -> Path | None:
        return quarantine(self.path, self.clock.now())

    def save(self, baselines: BaselineSet) -> None:
        """Write atomically: a reader sees the old file or the new one, never a partial one."""
        baselines.updated = self.clock.now()
        payload = json.dumps(baselines.to_json(), indent=1, allow_nan=False).encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, payload)
