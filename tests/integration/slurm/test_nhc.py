"""LBNL NHC as slurmd's HealthCheckProgram on a real Slurm cluster, running check_ingero.

Two nodes, each with its own node DB (all slurmds share this host) written by the node DB
writer as ``ingero trace`` writes NVML's rows. A lost GPU in n2's node DB: NHC, run by
slurmd, drains n2 with its reason, which carries ingero's; Fleet's drain controller (the
real one, auto-resume on, even told n2 recovered) never resumes it, nor does ``ingero
drain resume``. Fleet drains n1 for a straggler: NHC, passing n1, leaves that drain alone.
n2's GPU back: NHC resumes the node it drained; n1's GPU lost while Fleet holds it: NHC
keeps Fleet's reason.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingero.collectors.nvml import GpuReading, NvmlReading
from ingero.nodedb.schema import connect
from ingero.nodedb.writer import Batch, write_batch
from ingero.slurm.backend import NodeInfo
from ingero.slurm.drain_policy import DrainConfig
from ingero.slurm.scontrol_backend import ScontrolBackend
from ingero.trace.gpusampler import reading_rows
from tests.integration.nhc.nhc import install
from tests.integration.nhc.nhc import missing_reason as nhc_missing
from tests.integration.slurm.cluster import SlurmCluster, missing_reason, slurm_cluster
from tests.integration.slurm.test_drain import Run, ingero, resolved, verdict

pytestmark = pytest.mark.integration

NHC_REASON = "NHC: check_ingero:  ingero: GPU 1: lost (NVML)"


def gpu_rows(node_dir: Path, node: str, lost: bool = False) -> None:
    """One interval of NVML rows for the node's two GPUs (GPU 1 lost, or healthy)."""
    now = time.time()
    gpus = (GpuReading(0, utilization=0.9, xids=()), GpuReading(1, utilization=0.9, lost=lost))
    db = connect(node_dir / f"{node}.db")
    try:
        write_batch(
            db, Batch(gpu_intervals=reading_rows(NvmlReading(gpus), now - 1, now).intervals)
        )
    finally:
        db.conn.close()


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[SlurmCluster, Path]]:
    reason = missing_reason() or nhc_missing()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="ingero-nhc-"))
    try:
        root.chmod(0o755)
        nhc = install(root / "nhc")
        node_dir = root / "nodes"
        node_dir.mkdir()
        for node in ("n1", "n2"):
            gpu_rows(node_dir, node)
        conf = nhc.conf(
            "nhc",
            f"* || check_ingero -- --db {node_dir}/$HOSTNAME.db"
            f" --state-file {node_dir}/$HOSTNAME.health.json",
        )
        # slurmd gives the HealthCheckProgram SLURMD_NODENAME and nothing else: the site's
        # wrapper says which slurm.conf and (one host, several slurmds) which node it is.
        wrapper = root / "health-check"
        argv = " ".join(
            nhc.argv(conf, "HOSTNAME=$SLURMD_NODENAME", log=f"{root}/log/nhc-$SLURMD_NODENAME.log")
        )
        wrapper.write_text(f"#!/bin/bash\nexport SLURM_CONF={root}/etc/slurm.conf\nexec {argv}\n")
        wrapper.chmod(0o755)
        extra = (
            f"HealthCheckProgram={wrapper}",
            "HealthCheckInterval=2",
            "HealthCheckNodeState=ANY",
        )
        with slurm_cluster(root, 2, extra_conf=extra) as running:
            yield running, node_dir
    finally:
        shutil.rmtree(root, ignore_errors=True)


def node(name: str) -> NodeInfo:
    (found,) = [n for n in ScontrolBackend(timeout=10).nodes() if n.name == name]
    return found


def wait(predicate: object, what: str, timeout: float = 60) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_nhc_owns_its_drain_and_leaves_fleets_alone(
    cluster: tuple[SlurmCluster, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    slurm, node_dir = cluster
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    log = slurm.root / "log"
    wait(
        lambda: (log / "nhc-n1.log").exists() and (log / "nhc-n2.log").exists(), "NHC's first runs"
    )
    assert not node("n1").drained and not node("n2").drained

    gpu_rows(node_dir, "n2", lost=True)
    wait(lambda: node("n2").drained, "NHC draining n2")
    assert node("n2").reason == NHC_REASON
    show = slurm.run(["scontrol", "show", "node", "n2"]).stdout
    assert f"Reason={NHC_REASON} [" in show and "DRAIN" in show
    assert not node("n1").drained

    # Fleet's drain controller, auto-resume on, told n2 recovered: not its reason, not its node.
    run = Run(
        DrainConfig(enabled=True, max_fraction=0.5, min_intervals=1, cooldown=0, auto_resume=True)
    )
    try:
        run.tick(events=(resolved("n2", "recovered"),))
        run.tick()
        run.tick()
        assert node("n2").reason == NHC_REASON and run.of("node_resumed") == []
        refused = ingero("drain", "resume", "n2")
        assert refused.returncode == 2 and "not written by ingero" in refused.stderr

        # Fleet drains n1 (a straggler); NHC passes n1 and leaves Fleet's drain as it is.
        run.tick(verdict("n1"))
        assert node("n1").drained and str(node("n1").reason).startswith("ingero: straggler")
        seen = (log / "nhc-n1.log").read_text().count("Not onlining n1")
        wait(
            lambda: (log / "nhc-n1.log").read_text().count("Not onlining n1") > seen,
            "NHC passing n1 while Fleet holds it",
        )
        assert str(node("n1").reason).startswith("ingero: straggler")
        assert "Down for non-NHC reason (ingero: straggler" in (log / "nhc-n1.log").read_text()
    finally:
        run.controller.stop()

    # n2's GPU is back: NHC resumes the node it drained.
    gpu_rows(node_dir, "n2")
    wait(lambda: not node("n2").drained, "NHC resuming n2")
    # NHC's check failing on the node Fleet drained: it keeps Fleet's reason, so the node
    # stays Fleet's to resume.
    gpu_rows(node_dir, "n1", lost=True)
    wait(
        lambda: "Marking drain n1 offline:  ingero: straggler" in (log / "nhc-n1.log").read_text(),
        "NHC failing n1",
    )
    assert str(node("n1").reason).startswith("ingero: straggler")
