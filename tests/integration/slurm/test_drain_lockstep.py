"""Drains on a lock-step job's hang, on the real Slurm cluster: the rank that holds the job
back is drained when its node is the cause, the ranks that wait for it never are.

A lock-step job of 4 ranks, one a Slurm node (n1-n4; ``ingero workload --job-ranks``: one
process writes every rank's node DB, NCCL rows as the tracer writes them, the call
returning at enqueue), a real ``ingero fleet-push`` per node and the real ``ingero fleet``
daemon with ``drain.enabled`` against the cluster's slurmctld. Rank 2 (n3) stops before
its next collective: its three peers enter it and wait, launching nothing, as it does.
Fleet names n3 the rank they wait for and n3 is a stalled straggler. With no GPU, host or
network sign on n3 its class is ``job`` (rank 0 writing a checkpoint alone looks so) and
it is not drained (``job_cause``); once its GPU is lost (XID 79: the hang's cause on the
node) it is drained with an ingero reason, ``class=hardware``. n1, n2 and n4 are never
drained, however long the hang lasts.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from ingero.slurm.scontrol_backend import ScontrolBackend
from tests.integration.fleet.helpers import wait_for
from tests.integration.push.cluster import Procs, ingero
from tests.integration.slurm.cluster import SlurmCluster
from tests.integration.slurm.test_drain import start_drain_fleet

pytestmark = pytest.mark.integration

INTERVAL = 0.5
NODES = ["n1", "n2", "n3", "n4"]
HUNG = 2  # rank 2: node n3


def drained() -> set[str]:
    return {n.name for n in ScontrolBackend(timeout=10).nodes() if n.drained}


def test_a_hang_drains_the_missing_rank_on_its_node_s_cause_never_one_that_waits(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    procs = Procs()
    fleet = start_drain_fleet(
        tmp_path,
        slurm,
        # the nodes push every 0.5 s; half of the 1 s defaults, as at a 1 s push
        {"push_interval": f"{INTERVAL}s", "nccl": {"wait_after": "0.5s"}},
    )
    try:
        control = tmp_path / "job-control"
        control.write_text("0\n")
        procs.start(
            ingero("workload", "--job-ranks", "4", "--db", str(tmp_path / "r{rank}" / "ingero.db"),
                   "--proc-dir", str(tmp_path / "r{rank}" / "proc"), "--interval", "0.25",
                   "--control", str(control), "--job-id", "41", "--seed", "3"),
            tmp_path / "workload.log",
        )  # fmt: skip
        for rank, node in enumerate(NODES):
            config = {
                "fleet_endpoint": f"http://{fleet.otlp_http}",
                "api_endpoint": f"http://{fleet.api}",
                "push_interval": f"{INTERVAL}s",
                "node_id": node,
                "cluster_id": "ingerotest",
                "node_db": str(tmp_path / f"r{rank}" / "ingero.db"),
                "state_dir": str(tmp_path / f"{node}.state"),
                # A loaded 2-core host delays the workload and Fleet's ticks: a quiet node
                # holds for Fleet's word for 10 samples (5 by default).
                "score": {
                    "proc_root": str(tmp_path / f"r{rank}" / "proc"),
                    "collective_wait_samples": 10,
                },
                "channels": {"journal_socket": str(tmp_path / "no-journald.sock")},
            }
            path = tmp_path / f"{node}.yaml"
            path.write_text(yaml.safe_dump(config))
            procs.start(
                ingero("fleet-push", "--config", str(path), "--job-id", "41", "--rank",
                       str(rank), "--world-size", "4"),
                tmp_path / f"{node}.log",
            )  # fmt: skip

        def quorum() -> bool:
            url = f"http://{fleet.api}/api/v1/threshold?cluster_id=ingerotest&job_id=41"
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    view = json.loads(response.read())
            except urllib.error.HTTPError:  # 404: no push of the job's group yet
                return False
            return bool(view["quorum_met"]) and view["active_nodes"] == len(NODES)

        wait_for(quorum, 120, "the job's four nodes active, with a quorum")
        assert drained() == set()
        control.write_text(f"rank {HUNG} hang\n")
        hung_at = time.monotonic()
        seen: set[str] = set()

        def skipped_n3() -> bool:
            seen.update(drained())
            return any(
                "not draining n3" in line and "class job" in line
                for line in fleet.log().splitlines()
            )

        wait_for(skipped_n3, 90, "Fleet to name n3 and skip it as the job's own (class job)")
        assert 'missing_nodes=["n3"]' in fleet.log()
        assert seen == set(), seen
        control.write_text(f"rank {HUNG} hang lost\n")

        def n3_drained() -> bool:
            now = drained()
            seen.update(now)
            return "n3" in now

        wait_for(n3_drained, 90, "Fleet to drain n3 once its GPU is lost")
        waited = time.monotonic() - hung_at
        reason = next(n.reason for n in ScontrolBackend(timeout=10).nodes() if n.name == "n3")
        assert reason is not None and reason.startswith("ingero: straggler"), reason
        assert reason.endswith("class=hardware"), reason
        # As long again: the waiting ranks stay in service.
        deadline = time.monotonic() + max(5.0, waited)
        while time.monotonic() < deadline:
            seen.update(drained())
            time.sleep(0.2)
        assert seen == {"n3"}, seen
        for node in ("n1", "n2", "n4"):
            assert "waiting for rank 2 (n3)" in (tmp_path / f"{node}.log").read_text()
    finally:
        procs.stop_all()
        assert fleet.stop() == 0
