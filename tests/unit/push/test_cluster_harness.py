"""The push tests' simulated nodes score no reading of the host they all share.

Their fleet-push reads the host's CPU and memory from ``score.proc_root``; on the host's own
/proc, memory that anything else on it took moved every node's score at once, and with Fleet
away (its cached threshold fixed) healthy nodes fell below it (test_cluster.py's
``test_straggler_failover_and_restart``, under 15% of the host's memory taken).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ingero.collectors.procfs import ProcReader
from ingero.push.config import PushConfig
from ingero.runtime.config import load_config
from tests.integration.push.cluster import Cluster, Procs

PORTS = {"otlp_grpc": 4317, "otlp_http": 4318, "api": 8080}


def cluster(tmp_path: Path, **kw: Any) -> Cluster:
    return Cluster(tmp_path, Procs(), 0.5, 2, ports=dict(PORTS), **kw)


def loaded(tmp_path: Path, cfg: dict[str, Any]) -> PushConfig:
    path = tmp_path / "push.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return load_config(PushConfig, "fleet-push", path)


def test_every_node_reads_a_fixed_proc_not_the_hosts(tmp_path: Path) -> None:
    c = cluster(tmp_path)
    roots = set()
    for i, transport in ((0, "http"), (1, "grpc")):
        config = loaded(tmp_path, c.push_config_for(i, transport))
        root = Path(config.score.proc_root)
        assert root.resolve() != Path("/proc").resolve()
        roots.add(root)
        reader = ProcReader(root)
        for _ in range(3):
            assert reader.meminfo().available_fraction == 1.0
            assert reader.cpu_busy_fraction() is None  # never moves: not measured
    assert roots == {c.host_proc()}


def test_a_tests_own_score_section_keeps_the_fixed_proc(tmp_path: Path) -> None:
    score = {"weights": {"throughput": 0.2, "compute": 0.6, "memory": 0.2, "cpu": 0.0}}
    c = cluster(tmp_path, push_config={"score": score})
    config = loaded(tmp_path, c.push_config_for(0))
    assert Path(config.score.proc_root) == c.host_proc()
    assert config.score.weights.memory == 0.2
    own = cluster(tmp_path, push_config={"score": {**score, "proc_root": "/elsewhere"}})
    assert own.push_config_for(1)["score"]["proc_root"] == "/elsewhere"
