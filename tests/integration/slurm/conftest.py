"""One real Slurm cluster (munged + slurmctld + 4 slurmd) per test module, with ingero's
hooks installed from slurm/; each test starts with every node idle and undrained. One
MariaDB server per session for the clusters that run slurmdbd (``mariadb``)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingero.slurm.scontrol_backend import ScontrolBackend
from tests.integration.slurm.cluster import (
    MariaDb,
    SlurmCluster,
    mariadb_missing_reason,
    mariadb_server,
    missing_reason,
    slurm_cluster,
)

REPO = Path(__file__).resolve().parents[3]
NODES = 4


@pytest.fixture(scope="session")
def mariadb() -> Iterator[MariaDb]:
    """One MariaDB server for the session: each cluster with accounting has its own
    database in it (a server start per test would cost seconds each)."""
    reason = mariadb_missing_reason()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="ingero-mariadb-"))
    try:
        with mariadb_server(root) as server:
            yield server
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    # Not pytest's tmp_path: its parents are 0700 and munged runs as the munge user.
    root = Path(tempfile.mkdtemp(prefix="ingero-slurm-"))
    try:
        yield from _cluster(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _cluster(root: Path) -> Iterator[SlurmCluster]:
    root.chmod(0o755)
    hooks = root / "hooks"
    hooks.mkdir()
    for name in ("prolog", "epilog", "taskprolog", "ingero-hook"):
        shutil.copy2(REPO / "slurm" / name, hooks / name)
    # All "nodes" share this host's file system: each gets its own jobs dir and event log,
    # picked by $SLURMD_NODENAME, which slurmd sets for every hook.
    (hooks / "ingero-slurm.env").write_text(
        f"INGERO_PYTHON={sys.executable}\n"
        f"INGERO_JOBS_DIR={root}/jobs/$SLURMD_NODENAME\n"
        f"INGERO_EVENT_LOG={root}/events/$SLURMD_NODENAME.ndjson\n"
        f"INGERO_JOURNAL_SOCKET={root}/no-journal\n"
    )
    (root / "events").mkdir()
    (root / "out").mkdir()
    (root / "out").chmod(0o777)
    hook_conf = {
        "Prolog": hooks / "prolog",
        "Epilog": hooks / "epilog",
        "TaskProlog": hooks / "taskprolog",
    }
    with slurm_cluster(root, NODES, hooks=hook_conf, gpus=2) as running:
        yield running


@pytest.fixture
def slurm(cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmCluster:
    """The cluster with every node undrained; ``SLURM_CONF`` set for in-process backends."""
    if "slurmctld" not in cluster.procs or cluster.procs["slurmctld"].poll() is not None:
        cluster.start_controller()
    for node in cluster.node_names:
        cluster.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    backend = ScontrolBackend(timeout=10)

    def clean() -> bool:
        # A resumed node shows NOT_RESPONDING until its slurmd registers again.
        return all(n.state == "idle" and not n.flags and not n.reason for n in backend.nodes())

    cluster.wait(clean, 60, "every node idle, undrained and responding")
    return cluster
