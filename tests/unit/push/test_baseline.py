"""Baselines: EMA bias correction, atomic persistence and quarantine of untrusted files."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from ingero.push.baseline import (
    CLOCK_SKEW_ALLOWANCE_S,
    MAX_FILE_BYTES,
    BaselineStore,
    EmaBaseline,
)
from ingero.runtime.clock import ManualClock


def test_bias_correction_first_sample_is_the_sample() -> None:
    b = EmaBaseline(alpha=0.1)
    assert b.estimate is None
    b.update(500.0)
    assert b.estimate == pytest.approx(500.0)  # uncorrected it would be 50


@pytest.mark.parametrize("alpha", [0.05, 0.3, 1.0])
def test_bias_correction_matches_adam_formula(alpha: float) -> None:
    b = EmaBaseline(alpha=alpha)
    samples = [100.0, 120.0, 90.0, 110.0, 105.0]
    ema = 0.0
    for n, x in enumerate(samples, start=1):
        b.update(x)
        ema = (1 - alpha) * ema + alpha * x
        assert b.estimate == pytest.approx(ema / (1 - (1 - alpha) ** n))


def test_constant_input_gives_constant_estimate() -> None:
    b = EmaBaseline(alpha=0.2, alpha_down=0.01)
    for _ in range(50):
        b.update(42.0)
        assert b.estimate == pytest.approx(42.0)


def test_slow_alpha_while_below_keeps_a_straggler_from_becoming_its_baseline() -> None:
    b = EmaBaseline(alpha=0.3, alpha_down=0.02)
    for _ in range(20):
        b.update(1000.0)
    for _ in range(5):
        b.update(700.0)
    estimate = b.estimate
    assert estimate is not None
    assert estimate > 900.0
    symmetric = EmaBaseline(alpha=0.3)
    for _ in range(20):
        symmetric.update(1000.0)
    for _ in range(5):
        symmetric.update(700.0)
    assert symmetric.estimate is not None and symmetric.estimate < 800.0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_update_rejects_bad_samples(bad: float) -> None:
    b = EmaBaseline(alpha=0.3)
    with pytest.raises(ValueError):
        b.update(bad)
    assert b.n == 0


def store(tmp_path: Path, clock: ManualClock, node: str = "node-1") -> BaselineStore:
    return BaselineStore(
        tmp_path / "baseline.json", node_id=node, clock=clock, alpha=0.3, alpha_down=0.02
    )


def saved(tmp_path: Path, clock: ManualClock) -> BaselineStore:
    s = store(tmp_path, clock)
    baselines = s.new()
    b = EmaBaseline(alpha=0.3, alpha_down=0.02)
    for x in (1000.0, 1010.0, 990.0):
        b.update(x)
    baselines.baselines["kernel_launch_rate"] = b
    baselines.samples = 3
    s.save(baselines)
    return s


def test_round_trip_restores_estimate_and_samples(tmp_path: Path) -> None:
    clock = ManualClock()
    s = saved(tmp_path, clock)
    clock.advance(60)
    loaded = s.load()
    assert loaded.baselines is not None
    assert loaded.reason is None
    assert loaded.baselines.samples == 3
    restored = loaded.baselines.baselines["kernel_launch_rate"]
    assert restored.n == 3
    assert restored.estimate == pytest.approx(1000.0, rel=0.02)
    data = json.loads(s.path.read_text())
    assert {"version", "node_id", "created", "updated"} <= set(data)


def test_missing_file_is_not_an_error(tmp_path: Path) -> None:
    loaded = store(tmp_path, ManualClock()).load()
    assert loaded.baselines is None
    assert loaded.quarantined_to is None
    assert loaded.reason == "no baseline file"


def _rewrite(path: Path, **changes: object) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda p: p.write_text("{not json"), "corrupt"),
        (lambda p: p.write_bytes(b"\xff\xfe\x00garbage"), "corrupt"),
        (lambda p: p.write_text("[1, 2]"), "corrupt"),
        (lambda p: _rewrite(p, baselines={"x": {"ema": "a", "weight": 1, "n": 1}}), "corrupt"),
        (lambda p: _rewrite(p, baselines={"x": {"ema": 1.0, "weight": 2.0, "n": 1}}), "corrupt"),
        (lambda p: _rewrite(p, samples=-4), "corrupt"),
        (lambda p: p.write_text(" " * (MAX_FILE_BYTES + 1)), "oversized"),
        (lambda p: _rewrite(p, version=99), "wrong version"),
        (lambda p: _rewrite(p, node_id="node-7"), "foreign"),
        (
            lambda p: _rewrite(p, updated=1_700_000_000.0 + CLOCK_SKEW_ALLOWANCE_S + 3600),
            "future-dated",
        ),
    ],
)
def test_untrusted_file_is_quarantined(tmp_path: Path, damage: object, reason: str) -> None:
    clock = ManualClock()
    s = saved(tmp_path, clock)
    original = s.path.read_bytes()
    damage(s.path)  # type: ignore[operator]
    damaged = s.path.read_bytes()
    assert damaged != original
    loaded = s.load()
    assert loaded.baselines is None
    assert loaded.reason is not None and loaded.reason.startswith(reason)
    assert loaded.quarantined_to == tmp_path / f"baseline.json.quarantined.{int(clock.now())}"
    assert loaded.quarantined_to.read_bytes() == damaged  # nothing is lost
    assert not s.path.exists()


def test_small_clock_skew_is_tolerated(tmp_path: Path) -> None:
    clock = ManualClock()
    s = saved(tmp_path, clock)
    _rewrite(s.path, updated=clock.now() + CLOCK_SKEW_ALLOWANCE_S - 1)
    assert s.load().baselines is not None


def test_save_replaces_atomically_and_leaves_no_temp_files(tmp_path: Path) -> None:
    clock = ManualClock()
    s = saved(tmp_path, clock)
    stop = threading.Event()
    seen: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                seen.append(s.path.read_text())
            except FileNotFoundError:
                seen.append("<missing>")

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        baselines = s.load().baselines
        assert baselines is not None
        for i in range(50):
            baselines.samples = i
            s.save(baselines)
    finally:
        stop.set()
        thread.join()
    assert seen
    for text in seen:
        assert text != "<missing>"
        json.loads(text)  # every read saw a whole file
    assert sorted(os.listdir(tmp_path)) == ["baseline.json"]


def test_failed_save_keeps_the_old_file(tmp_path: Path) -> None:
    clock = ManualClock()
    s = saved(tmp_path, clock)
    before = s.path.read_text()
    baselines = s.load().baselines
    assert baselines is not None
    baselines.baselines["kernel_launch_rate"].ema = float("nan")
    with pytest.raises(ValueError):
        s.save(baselines)
    assert s.path.read_text() == before
    assert sorted(os.listdir(tmp_path)) == ["baseline.json"]
