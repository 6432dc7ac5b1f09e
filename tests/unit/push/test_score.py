"""Health score rules: weights, bounds, NaN/inf, floor penalty, dominant signal."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingero.push.score import (
    ScoreConfig,
    ScoreInputs,
    ScoreWeights,
    compute_score,
    floor_factor,
    smoothstep,
)
from ingero.runtime.config import build
from ingero.runtime.errors import ConfigError

CFG = ScoreConfig()


def full(**overrides: float | None) -> ScoreInputs:
    values: dict[str, float | None] = {
        "throughput_rate": 1000.0,
        "throughput_baseline": 1000.0,
        "gpu_busy_fraction": 1.0,
        "gpu_busy_baseline": 1.0,
        "mem_free_fraction": 1.0,
        "cpu_busy_fraction": 0.0,
    }
    values.update(overrides)
    return ScoreInputs(**values)  # type: ignore[arg-type]


def test_default_weights_sum_to_one_and_match_the_spec() -> None:
    assert ScoreWeights().as_dict() == {
        "throughput": 0.40,
        "compute": 0.25,
        "memory": 0.20,
        "cpu": 0.15,
    }
    CFG.validate()


@pytest.mark.parametrize("cpu", [0.1499, 0.1501, 0.2])
def test_weights_not_summing_to_one_are_rejected(cpu: float) -> None:
    with pytest.raises(ValueError, match="must sum to 1"):
        ScoreConfig(weights=ScoreWeights(cpu=cpu)).validate()


def test_weights_within_tolerance_are_accepted() -> None:
    ScoreConfig(weights=ScoreWeights(cpu=0.15 + 5e-7)).validate()


def test_config_loader_reports_the_key() -> None:
    with pytest.raises(ConfigError, match=r"f\.yaml: weights\..*must sum to 1"):
        build(ScoreConfig, {"weights": {"throughput": 0.5}}, "f.yaml")
    with pytest.raises(ConfigError, match="ema_alpha_down"):
        build(ScoreConfig, {"ema_alpha": 0.1, "ema_alpha_down": 0.5}, "f.yaml")
    cfg = build(
        ScoreConfig,
        {"weights": {"throughput": 0.5, "compute": 0.2, "memory": 0.15, "cpu": 0.15}},
        "f.yaml",
    )
    assert cfg.weights.throughput == 0.5


def test_perfect_node_scores_one_with_no_dominant_signal() -> None:
    result = compute_score(full(), CFG)
    assert result.score == pytest.approx(1.0)
    assert result.dominant_signal is None
    assert result.invalid_inputs == ()
    assert result.penalty == 1.0


def test_weighted_sum() -> None:
    result = compute_score(
        full(
            throughput_rate=800.0,
            gpu_busy_fraction=0.6,
            mem_free_fraction=0.5,
            cpu_busy_fraction=0.4,
        ),
        CFG,
    )
    expected = 0.4 * 0.8 + 0.25 * 0.6 + 0.2 * 0.5 + 0.15 * 0.6
    assert result.score == pytest.approx(expected)
    assert dict(result.signals) == pytest.approx(
        {"throughput": 0.8, "compute": 0.6, "memory": 0.5, "cpu": 0.6}
    )


@pytest.mark.parametrize(
    ("field", "value", "signal", "expected"),
    [
        ("throughput_rate", 2000.0, "throughput", 1.0),  # faster than baseline is capped at 1
        ("gpu_busy_fraction", 1.2, "compute", 1.0),  # overlapping intervals may exceed 1
        ("cpu_busy_fraction", 1.0, "cpu", 0.0),
        ("cpu_busy_fraction", 0.0, "cpu", 1.0),
        ("mem_free_fraction", 0.0, "memory", 0.0),
    ],
)
def test_signals_stay_in_unit_interval(
    field: str, value: float, signal: str, expected: float
) -> None:
    result = compute_score(full(**{field: value}), CFG)
    assert result.signals[signal] == pytest.approx(expected)
    assert 0.0 <= result.score <= 1.0


def test_first_sample_without_baseline_is_neutral() -> None:
    result = compute_score(full(throughput_baseline=None), CFG)
    assert result.signals["throughput"] == 1.0


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -1.0])
@pytest.mark.parametrize(
    "field", ["throughput_rate", "gpu_busy_fraction", "mem_free_fraction", "cpu_busy_fraction"]
)
def test_nan_inf_and_negative_become_zero_and_are_reported(field: str, bad: float) -> None:
    result = compute_score(full(**{field: bad}), CFG)
    assert field in result.invalid_inputs
    assert math.isfinite(result.score)
    assert 0.0 <= result.score <= 1.0
    assert all(math.isfinite(v) for v in result.signals.values())
    assert all(math.isfinite(v) for v in result.rates.values())


def test_nan_cpu_busy_means_zero_busy_not_nan() -> None:
    result = compute_score(full(cpu_busy_fraction=math.nan), CFG)
    assert result.signals["cpu"] == 1.0


def test_nan_raw_rate_is_reported_and_not_pushed_as_nan() -> None:
    result = compute_score(
        ScoreInputs(
            throughput_rate=10.0, rates={"step_rate": math.nan, "kernel_launch_rate": 10.0}
        ),
        CFG,
    )
    assert "step_rate" in result.invalid_inputs
    assert result.rates["step_rate"] == 0.0
    assert result.rates["kernel_launch_rate"] == 10.0


def test_missing_signals_are_excluded_and_weights_renormalised() -> None:
    result = compute_score(full(gpu_busy_fraction=None, throughput_rate=500.0), CFG)
    assert result.missing_signals == ("compute", "gpu_health")
    assert "gpu_busy_fraction" not in result.rates  # not measured: not pushed as 0
    expected = (0.4 * 0.5 + 0.2 * 1.0 + 0.15 * 1.0) / 0.75
    assert result.score == pytest.approx(expected)


def test_nothing_measured_scores_zero() -> None:
    result = compute_score(ScoreInputs(), CFG)
    assert result.score == 0.0
    assert result.missing_signals == ("throughput", "compute", "memory", "cpu", "gpu_health")


def test_smoothstep_ends_and_midpoint() -> None:
    assert smoothstep(0.0) == 0.0
    assert smoothstep(1.0) == 1.0
    assert smoothstep(0.5) == 0.5
    assert smoothstep(-3.0) == 0.0
    assert smoothstep(7.0) == 1.0


def test_floor_penalty_bounds() -> None:
    assert floor_factor(0.2, 0.2, 0.5) == 1.0
    assert floor_factor(0.9, 0.2, 0.5) == 1.0
    assert floor_factor(0.0, 0.2, 0.5) == pytest.approx(0.5)
    assert floor_factor(0.0, 0.0, 0.5) == 1.0  # floor 0 disables it


def test_floor_penalty_is_continuous_and_monotone() -> None:
    xs = [i / 10_000 for i in range(0, 3001)]
    values = [floor_factor(x, 0.2, 0.5) for x in xs]
    steps = [b - a for a, b in itertools.pairwise(values)]
    assert all(s >= 0 for s in steps)
    assert max(steps) < 1e-3  # no jump anywhere, including at the floor
    # zero slope at the floor: the factor just below it is within O(h^2) of 1
    assert 1.0 - floor_factor(0.2 - 1e-4, 0.2, 0.5) < 1e-6


def test_floor_penalty_applies_to_the_score() -> None:
    at_floor = compute_score(full(mem_free_fraction=0.2), CFG)
    below = compute_score(full(mem_free_fraction=0.05), CFG)
    assert at_floor.penalty == 1.0
    assert below.penalty < 1.0
    linear_only = 0.4 + 0.25 + 0.2 * 0.05 + 0.15
    assert below.score == pytest.approx(linear_only * below.penalty)
    assert below.score < linear_only


def test_score_continuous_across_floor() -> None:
    eps = 1e-7
    a = compute_score(full(mem_free_fraction=0.2 - eps), CFG).score
    b = compute_score(full(mem_free_fraction=0.2 + eps), CFG).score
    assert abs(a - b) < 1e-6


@pytest.mark.parametrize(
    ("overrides", "dominant"),
    [
        ({"throughput_rate": 700.0}, "throughput"),
        ({"gpu_busy_fraction": 0.5}, "compute"),
        ({"mem_free_fraction": 0.3}, "memory"),
        ({"cpu_busy_fraction": 0.9}, "cpu"),
        # weighted: 0.4*0.1 = 0.04 < 0.15*0.5 = 0.075, so cpu dominates
        ({"throughput_rate": 900.0, "cpu_busy_fraction": 0.5}, "cpu"),
    ],
)
def test_dominant_signal_is_the_most_degraded_weighted(
    overrides: dict[str, float], dominant: str
) -> None:
    assert compute_score(full(**overrides), CFG).dominant_signal == dominant


def test_raw_rates_travel_with_the_score() -> None:
    result = compute_score(
        ScoreInputs(
            throughput_rate=1500.0,
            throughput_baseline=2000.0,
            gpu_busy_fraction=0.7,
            mem_free_fraction=0.4,
            cpu_busy_fraction=0.3,
            rates={"kernel_launch_rate": 1500.0, "step_rate": 7.5},
        ),
        CFG,
    )
    assert dict(result.rates) == {
        "kernel_launch_rate": 1500.0,
        "step_rate": 7.5,
        "gpu_busy_fraction": 0.7,
        "mem_free_fraction": 0.4,
        "cpu_busy_fraction": 0.3,
    }


def test_result_is_frozen() -> None:
    result = compute_score(full(), CFG)
    with pytest.raises(AttributeError):
        result.score = 0.5  # type: ignore[misc]
    with pytest.raises(TypeError):
        result.signals["cpu"] = 0.0  # type: ignore[index]


any_float = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True))


@given(
    rate=any_float,
    baseline=any_float,
    busy=any_float,
    mem=any_float,
    cpu=any_float,
    extra=st.dictionaries(st.sampled_from(["kernel_launch_rate", "step_rate"]), any_float),
)
def test_any_input_gives_a_finite_score_in_unit_interval(
    rate: float | None,
    baseline: float | None,
    busy: float | None,
    mem: float | None,
    cpu: float | None,
    extra: dict[str, float | None],
) -> None:
    result = compute_score(
        ScoreInputs(rate, baseline, busy, mem, cpu, extra, gpu_busy_baseline=1.0), CFG
    )
    assert 0.0 <= result.score <= 1.0
    assert all(0.0 <= v <= 1.0 for v in result.signals.values())
    assert all(math.isfinite(v) for v in result.rates.values())
    assert 0.5 <= result.penalty <= 1.0
    for name, value in (("throughput_rate", rate), ("cpu_busy_fraction", cpu)):
        bad = value is not None and (not math.isfinite(value) or value < 0)
        assert (name in result.invalid_inputs) == bad


@given(
    signals=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=4, max_size=4),
    drop=st.floats(min_value=0.01, max_value=0.5),
)
def test_score_never_rises_when_a_signal_falls(signals: list[float], drop: float) -> None:
    t, c, m, u = signals
    base = compute_score(
        full(
            throughput_rate=1000.0 * t,
            gpu_busy_fraction=c,
            mem_free_fraction=m,
            cpu_busy_fraction=1 - u,
        ),
        CFG,
    )
    lower = compute_score(
        full(
            throughput_rate=1000.0 * max(0.0, t - drop),
            gpu_busy_fraction=c,
            mem_free_fraction=m,
            cpu_busy_fraction=1 - u,
        ),
        CFG,
    )
    assert lower.score <= base.score + 1e-12


@pytest.mark.parametrize(
    ("busy", "baseline", "compute"),
    [
        (0.15, 0.15, 1.0),  # CPU-launch-bound job: 15% busy is its healthy level
        (0.12, 0.15, 0.8),  # 20% less GPU work than its own baseline
        (0.97, 0.98, 0.97 / 0.98),
        (1.0, 0.9, 1.0),  # above the baseline: capped at 1
        (0.5, None, 1.0),  # no baseline yet: neutral, like throughput
    ],
)
def test_compute_is_gpu_busy_relative_to_the_node_s_own_baseline(
    busy: float, baseline: float | None, compute: float
) -> None:
    result = compute_score(full(gpu_busy_fraction=busy, gpu_busy_baseline=baseline), CFG)
    assert result.signals["compute"] == pytest.approx(compute)
    assert result.rates["gpu_busy_fraction"] == busy


def test_a_gpu_the_job_barely_uses_leaves_compute_out() -> None:
    result = compute_score(full(gpu_busy_fraction=0.0, gpu_busy_baseline=0.01), CFG)
    assert "compute" in result.missing_signals and "compute" not in result.signals


@pytest.mark.parametrize("health", [1.0, 0.8, 0.5, 0.0])
def test_gpu_health_multiplies_the_weighted_score(health: float) -> None:
    healthy = compute_score(full(throughput_rate=900.0), CFG)
    result = compute_score(full(throughput_rate=900.0, gpu_health=health), CFG)
    assert result.score == pytest.approx(healthy.score * health)
    assert result.signals["gpu_health"] == health
    assert "gpu_health" not in result.missing_signals
    # The floor penalty looks at the weighted signals only.
    assert result.penalty == healthy.penalty


def test_gpu_health_dominates_when_it_takes_off_most() -> None:
    result = compute_score(full(throughput_rate=950.0, gpu_health=0.5), CFG)
    assert result.dominant_signal == "gpu_health"
    result = compute_score(full(throughput_rate=500.0, gpu_health=0.95), CFG)
    assert result.dominant_signal == "throughput"


def test_gpu_health_config_is_validated_by_the_loader() -> None:
    cfg = build(ScoreConfig, {"gpu_health": {"throttle_penalty": 0.3, "error_hold": "2m"}}, "f")
    assert cfg.gpu_health.throttle_penalty == 0.3 and cfg.gpu_health.error_hold == 120.0
    with pytest.raises(ConfigError, match=r"gpu_health\.error_penalty"):
        build(ScoreConfig, {"gpu_health": {"error_penalty": 1.5}}, "f.yaml")
