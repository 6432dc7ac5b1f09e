"""Fleet's decisions in the journal: a real ``ingero fleet`` drains a node of the real Slurm
cluster and panics on a degraded group, beside a real journald; ``journalctl -o json`` and
``ingero events`` then show every decision with its MESSAGE_ID and PRIORITY."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ingero.schema.events import MESSAGE_IDS
from tests.integration.journald_harness import run_with_journald, unavailable
from tests.integration.slurm.cluster import SlurmCluster

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.integration

# Runs inside the harness's mount namespace, where the private journald listens.
SCRIPT = r"""
import json, subprocess, sys
from pathlib import Path
from ingero.otlp.health import NodePush
from tests.integration.fleet.helpers import start_fleet, wait_for

tmp = Path(sys.argv[1])
config = {
    "drain": {"enabled": True, "max_fraction": 0.25, "min_intervals": 3, "cooldown": "0s"},
    "quorum": {"statistical_min": 3},
    "threshold": {"ema_alpha": 1.0, "panic_fraction": 0.3},
}

def push(fleet, scores, job):
    reply = fleet.push(
        NodePush(node_id=n, cluster_id="ingerotest", score=s, job_id=job, rank=i,
                 world_size=len(scores), workload_type="training")
        for i, (n, s) in enumerate(scores.items()))
    assert reply.status == 200, reply

fleet = start_fleet(tmp, config)
try:
    job41 = {"n1": 0.90, "n2": 0.91, "n3": 0.30, "n4": 0.92}
    wait_for(lambda: push(fleet, job41, "41") or "node_drained: node n3" in fleet.log(), 60, "n3")
    # job 42: 3 of its 8 nodes low at once (> panic_fraction): degraded, nothing drained
    job42 = {"n1": 0.30, "n2": 0.31, "n4": 0.32, "n3": 0.90, "n5": 0.91, "n6": 0.92,
             "n7": 0.90, "n8": 0.91}
    wait_for(lambda: push(fleet, job42, "42") or "drain_skipped" in fleet.log(), 60, "a skip")
finally:
    assert fleet.stop() == 0
subprocess.run(["journalctl", "--sync"], check=False)
entries = subprocess.run(
    ["journalctl", "-o", "json", "--no-pager", "SYSLOG_IDENTIFIER=ingero"],
    capture_output=True, text=True, check=True).stdout.splitlines()
rows = subprocess.run(
    [sys.executable, "-m", "ingero.cli.main", "events", "--json", "--since", "-1h"],
    capture_output=True, text=True, check=True).stdout
print(json.dumps({"entries": [json.loads(e) for e in entries], "rows": json.loads(rows),
                  "log": fleet.log()}))
"""


def test_fleet_decisions_reach_the_journal(slurm: SlurmCluster, tmp_path: Path) -> None:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    tmp_path.chmod(0o755)
    result = run_with_journald(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        timeout=180,
        env={"SLURM_CONF": str(slurm.conf), "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.splitlines()[-1])
    by_type: dict[str, list[dict[str, str]]] = {}
    for entry in out["entries"]:
        by_type.setdefault(entry["INGERO_EVENT"], []).append(entry)

    (drain,) = by_type["node_drained"]
    assert drain["MESSAGE_ID"] == MESSAGE_IDS["node_drained"] and drain["PRIORITY"] == "4"
    assert (drain["INGERO_NODE"], drain["INGERO_JOB"]) == ("n3", "41")
    assert drain["INGERO_REASON"].startswith("ingero: straggler score=0.30")
    assert drain["INGERO_BACKEND"] == "scontrol"
    degraded = by_type["group_degraded"][0]
    assert degraded["MESSAGE_ID"] == MESSAGE_IDS["group_degraded"]
    assert degraded["PRIORITY"] == "4" and degraded["INGERO_JOB"] == "42"
    assert degraded["INGERO_PANIC"] == "true"
    skips = by_type["drain_skipped"]
    assert {s["INGERO_SKIP"] for s in skips} == {"panic"}
    assert all(s["PRIORITY"] == "5" for s in skips)
    # Fleet's own straggler episode of n3 (detection_mode fleet), not only the node's
    assert any(
        e["INGERO_NODE"] == "n3" and e["INGERO_DETECTION_MODE"] == "fleet"
        for e in by_type["straggler_state"]
    )

    # the same decisions, grouped for a person
    kinds = {(row["kind"], row["node_id"], row["job_id"]) for row in out["rows"]}
    assert {("drain", "n3", "41"), ("degraded", "", "42"), ("straggler", "n3", "41")} <= kinds
    assert any(kind == "skip" and job == "42" for kind, _, job in kinds)

    # stderr is not the journal here (no JOURNAL_STREAM): the plain line is kept too
    assert "ingero node_drained: node n3 job 41" in out["log"]
