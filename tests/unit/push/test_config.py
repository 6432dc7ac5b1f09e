"""fleet-push configuration: defaults, validation, node id resolution."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ingero.push.config import PushConfig, resolve_node_id
from ingero.runtime.config import load_config
from ingero.runtime.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet-push.yaml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    cfg = PushConfig()
    assert cfg.push_interval == 5.0 and cfg.jitter == 0.1 and cfg.push_timeout == 2.5
    assert cfg.channels.event_socket == "/run/ingero/events.sock"
    assert cfg.node_db == "/var/lib/ingero/ingero.db"
    assert cfg.score.weights.throughput == 0.40


def test_file_and_overrides(tmp_path: Path) -> None:
    path = write(
        tmp_path, "push_interval: 2s\ndetection: {fleet_max_age: 10s}\nscore: {floor: 0.1}\n"
    )
    cfg = load_config(PushConfig, "fleet-push", path, {"cluster_id": "c9"})
    assert cfg.push_interval == 2.0 and cfg.detection.fleet_max_age == 10.0
    assert cfg.cluster_id == "c9" and cfg.score.floor == 0.1


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("transport: udp\n", "transport"),
        ("jitter: 0.9\n", "jitter"),
        ("push_interval: 2s\ntimeout: 3s\n", "timeout"),
        ("fleet_endpoint: fleet:4318\n", "fleet_endpoint"),
        ("detection: {fleet_max_age: 1h}\n", "fleet_max_age"),
        ("score: {weights: {throughput: 0.9}}\n", "sum to 1"),
        ("bogus: 1\n", "bogus"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_config(PushConfig, "fleet-push", write(tmp_path, text))


def test_node_id_resolution(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    assert resolve_node_id("cfg", {"SLURMD_NODENAME": "s"}, jobs) == "cfg"
    assert resolve_node_id(None, {"SLURMD_NODENAME": "s"}, jobs) == "s"
    jobs.mkdir()
    (jobs / "bad.json").write_text("{not json")
    (jobs / "7.json").write_text(json.dumps({"job_id": "7", "node_name": "gpu-07"}))
    assert resolve_node_id(None, {"SLURMD_NODENAME": "s"}, jobs) == "gpu-07"
    assert resolve_node_id(None, {}, tmp_path / "none")  # falls back to the host name
