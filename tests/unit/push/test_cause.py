"""The node's cause class (``ingero.push.cause``): the rules, then each injected cause of
``ingero workload --cause``, recorded into a node DB and read back through fleet-push's own
window reader and GPU-health tracker, classed as an operator should act on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingero.nodedb.window import read_latest
from ingero.push.cause import RETRANSMITS_PER_S, node_cause_class
from ingero.push.gpu_health import GpuHealthTracker
from ingero.push.score import GpuHealthConfig
from tests.unit.workload.test_causes import T0, TICKS, record


def test_the_gravest_cause_the_sample_shows_wins() -> None:
    busy = RETRANSMITS_PER_S * 10
    assert node_cause_class(0.8, int(busy), 10.0, "cpu") == "hardware"
    assert node_cause_class(1.0, int(busy), 10.0, "cpu") == "network"
    assert node_cause_class(None, int(busy) - 1, 10.0, "cpu") == "node"
    assert node_cause_class(None, 0, 10.0, "memory") == "node"
    assert node_cause_class(1.0, 0, 10.0, "throughput") == "job"
    assert node_cause_class(None, 50, 0.0, "compute") == "job"  # no time covered: no rate


@pytest.mark.parametrize(
    ("cause", "expected"),
    [("throttle", "hardware"), ("net", "network"), ("alloc", "job"), ("recapture", "job"),
     (None, "job")],
)  # fmt: skip
def test_each_recorded_cause_gets_its_class(
    tmp_path: Path, cause: str | None, expected: str
) -> None:
    path = record(tmp_path / "n.db", cause, slowdown=0.3 if cause else 0.0)
    now = T0 + TICKS
    window = read_latest(path, now, 10.0, None)
    health = GpuHealthTracker(GpuHealthConfig()).observe(window.gpus, now).value
    # the score's dominant signal is the drop itself, whatever the cause
    assert node_cause_class(health, window.tcp_retransmits, window.covered_s, "throughput") == (
        expected
    )
