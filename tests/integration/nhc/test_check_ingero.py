"""Real LBNL NHC running ``check_ingero`` on this host (marking nothing in Slurm).

- A node's real ``ingero fleet-push`` (over a real-shaped ``ingero workload``, no Fleet:
  it judges itself against its own baseline) writes its health state file: NHC passes the
  healthy node, fails it once its straggler episode (a stalled rank) is older than
  ``-a``, naming ingero's reason, and passes it again once the episode ends.
- A node DB written by the node DB writer (as ``ingero trace`` writes NVML's rows): NHC
  passes healthy GPUs, fails an XID and a lost GPU, each named; with ``-S`` the straggler
  check is off, with ``-f`` a missing ingero fails instead of passing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingero.collectors.nvml import GpuReading, NvmlReading
from ingero.nodedb.writer import Batch, NodeDbWriter
from ingero.trace.gpusampler import reading_rows
from tests.integration.nhc.nhc import Nhc, install, missing_reason
from tests.integration.push.cluster import Cluster, Procs, free_port, wait_for

pytestmark = pytest.mark.integration

INTERVAL = 0.5
FAILED = "Health check failed:  check_ingero:  ingero: "


@pytest.fixture(scope="module")
def nhc(tmp_path_factory: pytest.TempPathFactory) -> Nhc:
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    return install(tmp_path_factory.mktemp("nhc"))


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Cluster]:
    """One node: workload + fleet-push + sink; no Fleet listens where it pushes."""
    c = Cluster(tmp_path, Procs(), INTERVAL, 1, job_id="77")
    c.ports = {"otlp_http": free_port(), "otlp_grpc": free_port(), "api": free_port()}
    c.push_config = {"health_state": str(tmp_path / "health.json")}
    try:
        yield c
    finally:
        c.procs.stop_all()


def verdict(nhc: Nhc, conf: Path) -> tuple[int, str]:
    done = nhc.run(conf)
    return done.returncode, done.stdout + done.stderr


def failing(nhc: Nhc, conf: Path, text: str, what: str) -> str:
    """NHC's output once it fails the node with ``text`` in its message."""

    def failed() -> str | None:
        code, out = verdict(nhc, conf)
        return out if code == 1 and text in out else None

    return wait_for(failed, 30, what)


def test_fleet_push_state_healthy_straggling_recovered(nhc: Nhc, node: Cluster) -> None:
    c = node
    db, state = c.tmp / "node00.db", c.tmp / "health.json"
    conf = nhc.conf("episode", f"* || check_ingero -a 1s -- --db {db} --state-file {state}")
    c.start_sink()
    c.start_workload(0)
    c.start_push(0)
    wait_for(lambda: "local-baseline" in c.modes("node00"), 60, "fleet-push on its own baseline")
    assert state.exists()
    assert verdict(nhc, conf) == (0, "")

    (c.tmp / "node00.slow").write_text("stall")
    wait_for(
        lambda: [e for e in c.events() if e.type == "straggler_state"], 40, "the stall flagged"
    )
    out = failing(nhc, conf, FAILED + "straggler for ", "NHC failing the straggling node")
    assert "(job 77, score " in out and ", stall)" in out, out

    (c.tmp / "node00.slow").write_text("0")
    wait_for(lambda: [e for e in c.events() if e.type == "straggler_resolved"], 60, "the recovery")
    assert wait_for(lambda: verdict(nhc, conf)[0] == 0, 30, "NHC passing the node again")


def h100(index: int, **values: object) -> GpuReading:
    healthy: dict[str, object] = {"utilization": 0.95, "ecc_uncorrected": 0, "xids": (),
                                  "remap_pending": False, "remap_failure": False}  # fmt: skip
    return GpuReading(index=index, **{**healthy, **values})  # type: ignore[arg-type]


def test_gpu_faults_in_the_node_db(nhc: Nhc, tmp_path: Path) -> None:
    db = tmp_path / "node.db"
    writer = NodeDbWriter(db)
    writer.start()

    def interval(*gpus: GpuReading) -> None:
        now = time.time()
        assert writer.submit(
            Batch(gpu_intervals=reading_rows(NvmlReading(gpus), now - 1, now).intervals)
        )

    missing = tmp_path / "no-state.json"
    conf = nhc.conf("gpu", f"* || check_ingero -w 10m -- --db {db} --state-file {missing}")
    try:
        interval(h100(0), h100(1))
        assert wait_for(lambda: verdict(nhc, conf)[0] == 0, 30, "a healthy verdict")
        interval(h100(0), h100(1, xids=(79,)))
        failing(nhc, conf, FAILED + "GPU 1: XID 79\n", "the XID named")
        interval(h100(0, lost=True), h100(1))
        failing(nhc, conf, FAILED + "GPU 0: lost (NVML); GPU 1: XID 79\n", "the lost GPU named")
    finally:
        writer.close()
    # Not installed where NHC is told it is: passed (logged), or failed with -f.
    gone = tmp_path / "no-ingero"
    passes = nhc.conf("absent", "* || check_ingero")
    assert nhc.run(passes, f"INGERO={gone}").returncode == 0
    strict = nhc.conf("strict", "* || check_ingero -f")
    done = nhc.run(strict, f"INGERO={gone}")
    assert done.returncode == 1
    assert f"check_ingero:  ingero cannot tell (exit 127: {gone} is not installed)" in done.stdout
