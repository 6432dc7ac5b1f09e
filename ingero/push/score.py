"""Node health score: four signals in [0,1], weighted, a smooth floor penalty, GPU health.

Pure: takes plain measurements, returns a frozen result. The formula is documented in
docs/health-score.md; in short ``score = sum w_i*s_i / sum w_i`` over the measured signals, times
``1 - strength*(1 - smoothstep(min(s)/floor))`` when the weakest signal is below ``floor``, times
the GPU hardware-health factor when it was measured. A signal that was not measured is left
out (and listed in ``missing_signals``); nothing stands in for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from ingero.runtime.config import Duration, in_range, positive

SIGNAL_NAMES: Final = ("throughput", "compute", "memory", "cpu")
# Not weighted: a factor on the weighted score (a sick GPU degrades whatever the rest says).
HEALTH_SIGNAL: Final = "gpu_health"
ALL_SIGNALS: Final = (*SIGNAL_NAMES, HEALTH_SIGNAL)
WEIGHT_TOLERANCE: Final = 1e-6
# Below this busy-fraction baseline the job barely uses its GPUs: the ratio to it says
# nothing about health, so compute is left out rather than scored on noise.
MIN_BUSY_BASELINE: Final = 0.05


@dataclass(frozen=True)
class ScoreWeights:
    """Weight of each signal; they must sum to 1 (± 1e-6)."""

    throughput: float = field(default=0.40, metadata=in_range(0.0, 1.0))
    compute: float = field(default=0.25, metadata=in_range(0.0, 1.0))
    memory: float = field(default=0.20, metadata=in_range(0.0, 1.0))
    cpu: float = field(default=0.15, metadata=in_range(0.0, 1.0))

    def as_dict(self) -> dict[str, float]:
        return {name: float(getattr(self, name)) for name in SIGNAL_NAMES}

    def validate(self) -> None:
        weights = self.as_dict()
        for name, value in weights.items():
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")
        total = sum(weights.values())
        if abs(total - 1.0) > WEIGHT_TOLERANCE:
            raise ValueError(f"{'+'.join(SIGNAL_NAMES)}: must sum to 1, got {total:.6g}")


@dataclass(frozen=True)
class GpuHealthConfig:
    """How much GPU hardware problems take off the score (a factor on it, per GPU, worst GPU)."""

    # A GPU slowed by its hardware (thermal, power brake, the slowdown line) for the whole
    # window multiplies the score by 1 - this; part of the window, by a share of it.
    throttle_penalty: float = field(default=0.2, metadata=in_range(0.0, 1.0))
    # An XID, new uncorrected ECC errors, a lost GPU, a pending or failed row remapping or
    # page retirement multiply it by 1 - this (a lost GPU: by 0).
    error_penalty: float = field(default=0.5, metadata=in_range(0.0, 1.0))
    # An XID or new ECC errors keep degrading the score this long after they were seen.
    error_hold: Duration = field(default=Duration(60.0), metadata=in_range(0.0, 86400.0))


@dataclass(frozen=True)
class ScoreConfig:
    """Score, baseline and node-state settings (the ``score:`` section of fleet-push's config)."""

    weights: ScoreWeights = field(default_factory=ScoreWeights)
    # Below this weakest-signal value the floor penalty starts; 0 disables it.
    floor: float = field(default=0.2, metadata=in_range(0.0, 1.0))
    # The most the floor penalty takes off (a signal at exactly 0 multiplies by 1 - this).
    floor_strength: float = field(default=0.5, metadata=in_range(0.0, 1.0))
    # Fast EMA of the throughput baseline while the rate is at or above it...
    ema_alpha: float = field(default=0.3, metadata=in_range(1e-6, 1.0))
    # ...and a slow one while below, so a straggler does not quickly become its own baseline.
    ema_alpha_down: float = field(default=0.02, metadata=in_range(1e-6, 1.0))
    warmup_samples: int = field(default=6, metadata=positive())
    idle_after: int = field(default=3, metadata=positive())
    # A stall is measured, not inferred from one quiet moment: the tracer's intervals since
    # the last kernel launch cover at least this many intervals (of any length)...
    stall_intervals: int = field(default=2, metadata=positive())
    # ...and at least this long (0: the intervals alone decide).
    stall_after: Duration = field(default=Duration(0.0), metadata=in_range(0.0, 86400.0))
    # A quiet node with a rank in a communicator with peers may be waiting for one of them
    # (not stalled) or holding them back: it holds its measurement for at most this many
    # quiet samples until Fleet's reply says which (ingero.push.waiting).
    collective_wait_samples: int = field(default=5, metadata=in_range(0, 1000))
    # A node DB whose tracer wrote nothing new for this long (and for 3 of its own
    # intervals) is stale: a silent tracer says nothing about the node, not "stalled".
    stale_after: Duration = field(default=Duration(15.0), metadata=positive())
    # Where host CPU and memory are read; tests and the demo point it at a synthetic tree.
    proc_root: str = "/proc"
    gpu_health: GpuHealthConfig = field(default_factory=GpuHealthConfig)

    def validate(self) -> None:
        try:
            self.weights.validate()
        except ValueError as exc:
            raise ValueError(f"weights.{exc}") from None
        if self.ema_alpha_down > self.ema_alpha:
            raise ValueError("ema_alpha_down: must not exceed ema_alpha")


@dataclass(frozen=True)
class ScoreInputs:
    """One window's measurements; ``None`` means not measured on this node."""

    throughput_rate: float | None = None
    throughput_baseline: float | None = None
    gpu_busy_fraction: float | None = None  # measured (NVML, nvidia-smi); never a sync estimate
    mem_free_fraction: float | None = None
    cpu_busy_fraction: float | None = None
    # Raw rates pushed alongside the score (kernel_launch_rate, step_rate, …).
    rates: dict[str, float | None] = field(default_factory=dict)
    gpu_busy_baseline: float | None = None
    gpu_health: float | None = None  # worst GPU's health factor in [0, 1]; None: not measured


@dataclass(frozen=True)
class ScoreResult:
    score: float
    signals: MappingProxyType[str, float]
    dominant_signal: str | None
    invalid_inputs: tuple[str, ...]
    missing_signals: tuple[str, ...]
    rates: MappingProxyType[str, float]
    penalty: float


def smoothstep(x: float) -> float:
    """3x^2 - 2x^3 on [0,1], clamped: continuous with zero slope at both ends."""
    x = min(1.0, max(0.0, x))
    return x * x * (3.0 - 2.0 * x)


def floor_factor(weakest: float, floor: float, strength: float) -> float:
    """Multiplier in [1 - strength, 1]; exactly 1 when ``weakest >= floor``."""
    if floor <= 0.0 or weakest >= floor:
        return 1.0
    return 1.0 - strength * (1.0 - smoothstep(weakest / floor))


def _clean(name: str, value: float | None, invalid: list[str]) -> float | None:
    """NaN, ±inf and negative values become 0 and are reported, never propagated."""
    if value is None:
        return None
    if not math.isfinite(value) or value < 0.0:
        invalid.append(name)
        return 0.0
    return float(value)


def _unit(value: float) -> float:
    return min(1.0, max(0.0, value))


def compute_score(inputs: ScoreInputs, config: ScoreConfig) -> ScoreResult:
    """Turn one window's measurements into a score in [0,1]."""
    invalid: list[str] = []
    rate = _clean("throughput_rate", inputs.throughput_rate, invalid)
    baseline = _clean("throughput_baseline", inputs.throughput_baseline, invalid)
    busy = _clean("gpu_busy_fraction", inputs.gpu_busy_fraction, invalid)
    busy_baseline = _clean("gpu_busy_baseline", inputs.gpu_busy_baseline, invalid)
    health = _clean("gpu_health", inputs.gpu_health, invalid)
    mem_free = _clean("mem_free_fraction", inputs.mem_free_fraction, invalid)
    cpu_busy = _clean("cpu_busy_fraction", inputs.cpu_busy_fraction, invalid)

    measured: dict[str, float] = {}
    if rate is not None:
        # Without a baseline yet (first sample) throughput is neutral, not a failure.
        measured["throughput"] = _unit(rate / baseline) if baseline else 1.0
    if busy is not None and (busy_baseline is None or busy_baseline >= MIN_BUSY_BASELINE):
        # Relative to the node's own busy baseline: a CPU-launch-bound job keeps its GPU 15%
        # busy when healthy, a GPU-bound one near 100%; each is healthy at its own level.
        measured["compute"] = _unit(busy / busy_baseline) if busy_baseline else 1.0
    if mem_free is not None:
        measured["memory"] = _unit(mem_free)
    if cpu_busy is not None:
        measured["cpu"] = _unit(1.0 - cpu_busy)

    rates: dict[str, float] = {}
    for key, value in inputs.rates.items():
        cleaned = _clean(key, value, invalid)
        if cleaned is not None:
            rates[key] = cleaned
    for key, cleaned_value in (
        ("gpu_busy_fraction", busy),
        ("gpu_busy_baseline", busy_baseline),
        ("mem_free_fraction", mem_free),
        ("cpu_busy_fraction", cpu_busy),
    ):
        if cleaned_value is not None:
            rates.setdefault(key, cleaned_value)

    weights = config.weights.as_dict()
    total_weight = sum(weights[name] for name in measured)
    signals = dict(measured)
    if health is not None:
        signals[HEALTH_SIGNAL] = _unit(health)
    missing = tuple(name for name in ALL_SIGNALS if name not in signals)
    if not measured or total_weight <= 0.0:
        return ScoreResult(
            score=0.0,
            signals=MappingProxyType(signals),
            dominant_signal=None,
            invalid_inputs=tuple(dict.fromkeys(invalid)),
            missing_signals=missing,
            rates=MappingProxyType(rates),
            penalty=1.0,
        )
    weighted = sum(weights[name] * value for name, value in measured.items()) / total_weight
    penalty = floor_factor(min(measured.values()), config.floor, config.floor_strength)
    factor = signals.get(HEALTH_SIGNAL, 1.0)

    # Each signal's deficit is what it takes off the score: its weighted share, or for GPU
    # health the part of the weighted score its factor removes.
    deficits = {
        name: weights[name] * (1.0 - value) / total_weight for name, value in measured.items()
    }
    deficits[HEALTH_SIGNAL] = weighted * (1.0 - factor)
    worst = max(ALL_SIGNALS, key=lambda name: deficits.get(name, -1.0))
    dominant = worst if deficits.get(worst, 0.0) > 0.0 else None

    return ScoreResult(
        score=_unit(weighted * penalty * factor),
        signals=MappingProxyType(signals),
        dominant_signal=dominant,
        invalid_inputs=tuple(dict.fromkeys(invalid)),
        missing_signals=missing,
        rates=MappingProxyType(rates),
        penalty=penalty,
    )
