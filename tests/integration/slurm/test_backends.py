"""Both Slurm backends against real clusters: Debian's Slurm 22.05 and Slurm 25.11 built from
source (tests/slurm25/build.sh), side by side on their own ports. The same tests run for
scontrol on both releases and for pyslurm on 25.11: drain with the reason ``scontrol show
node`` shows, no double drain, resume, refusal while slurmctld is down, a job's nodes in
node-rank order, and the one-line errors of an unknown node or job."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from ingero.runtime.errors import EXIT_UNAVAILABLE
from ingero.schema.events import Event
from ingero.slurm.backend import NodeInfo, SlurmBackend, SlurmError
from ingero.slurm.drain import DrainController
from ingero.slurm.drain_policy import DrainConfig
from ingero.slurm.factory import make_backend
from ingero.slurm.jobnodes import make_job_nodes
from ingero.slurm.pyslurm_backend import PyslurmBackend
from tests.integration.slurm import slurm25
from tests.integration.slurm.cluster import SlurmCluster, missing_reason, slurm_cluster
from tests.integration.slurm.test_drain import tick, verdict

pytestmark = pytest.mark.integration

NODES = 3
REASON = (
    "ingero: straggler score=0.30 threshold=0.86 job=41 since=2026-11-18T11:06:40Z class=hardware"
)
# 3 nodes: max_fraction 0.34 lets ingero hold one drained node.
CONFIG = DrainConfig(enabled=True, max_fraction=0.34, min_intervals=2, cooldown=0)


@dataclass(frozen=True)
class Case:
    release: str  # "22.05" (Debian) or "25.11" (built from source)
    backend: str  # "scontrol" or "pyslurm"

    @property
    def cluster_name(self) -> str:
        return "ingero" + self.release.replace(".", "")


CASES = [Case("22.05", "scontrol"), Case("25.11", "scontrol"), Case("25.11", "pyslurm")]


@pytest.fixture(scope="module")
def clusters() -> Iterator[dict[str, SlurmCluster]]:
    """One cluster per release, started when a test first needs it, all stopped at the end."""
    with ExitStack() as stack:

        class Started(dict[str, SlurmCluster]):
            def __missing__(self, release: str) -> SlurmCluster:
                root = Path(tempfile.mkdtemp(prefix=f"ingero-slurm{release}-"))
                stack.callback(shutil.rmtree, root, True)
                prefix = slurm25.PREFIX if release == "25.11" else None
                name = "ingero" + release.replace(".", "")
                cluster = stack.enter_context(
                    slurm_cluster(root, NODES, cluster_name=name, prefix=prefix)
                )
                self[release] = cluster
                return cluster

        yield Started()


def _skip_reason(case: Case) -> str | None:
    if case.release == "25.11":
        reason = (
            slurm25.pyslurm_missing_reason()
            if case.backend == "pyslurm"
            else slurm25.missing_reason()
        )
        if reason:
            return reason
    return missing_reason(slurm25.PREFIX if case.release == "25.11" else None)


@pytest.fixture(params=CASES, ids=lambda c: f"{c.backend}-{c.release}")
def case(request: pytest.FixtureRequest) -> Case:
    reason = _skip_reason(request.param)
    if reason:
        pytest.skip(reason)
    return request.param  # type: ignore[no-any-return]


def use_env(cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cluster's Slurm environment in this process's (and its children's)."""
    for key in ("SLURM_CONF", "PATH", "LD_LIBRARY_PATH"):
        if key in cluster.env:
            monkeypatch.setenv(key, cluster.env[key])
        else:
            monkeypatch.delenv(key, raising=False)


@pytest.fixture
def slurm(
    case: Case, clusters: dict[str, SlurmCluster], monkeypatch: pytest.MonkeyPatch
) -> SlurmCluster:
    """The case's cluster, every node idle and undrained, its environment in this process's
    (the backends run Slurm's commands, or pyslurm's worker, with it)."""
    cluster = clusters[case.release]
    use_env(cluster, monkeypatch)
    if "slurmctld" not in cluster.procs or cluster.procs["slurmctld"].poll() is not None:
        cluster.start_controller()
    for node in cluster.node_names:
        cluster.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
    check = make_backend("scontrol", timeout=10)

    def clean() -> bool:
        # A resumed node shows NOT_RESPONDING until its slurmd registers again.
        return all(n.state == "idle" and not n.flags and not n.held_reason for n in check.nodes())

    cluster.wait(clean, 60, "every node idle, undrained and responding")
    return cluster


@pytest.fixture
def backend(case: Case, slurm: SlurmCluster) -> Iterator[SlurmBackend]:
    made = make_backend(case.backend, timeout=10)
    assert made.name == case.backend
    yield made
    if isinstance(made, PyslurmBackend):
        made.close()


def _node(backend: SlurmBackend, name: str) -> NodeInfo:
    return {n.name: n for n in backend.nodes()}[name]


def show_node(cluster: SlurmCluster, node: str) -> str:
    return cluster.run(["scontrol", "show", "node", node]).stdout


def test_auto_picks_pyslurm_only_where_it_matches_the_slurm(
    case: Case, slurm: SlurmCluster
) -> None:
    reason = slurm25.pyslurm_missing_reason()
    if reason:
        pytest.skip(reason)
    chosen = make_backend("auto", timeout=10)
    expected = "pyslurm" if case.release == "25.11" else "scontrol"
    assert chosen.name == expected
    if isinstance(chosen, PyslurmBackend):
        assert chosen.hello["slurm"].startswith("25.11")
        chosen.close()


def test_drain_shows_the_reason_and_resume_ends_it(
    case: Case, slurm: SlurmCluster, backend: SlurmBackend
) -> None:
    backend.drain("n2", REASON)
    shown = show_node(slurm, "n2")
    assert f"Reason={REASON} [root@" in shown
    assert "DRAIN" in shown.split("State=")[1].split()[0]
    nodes = {n.name: n for n in backend.nodes()}
    assert nodes["n2"].drained and nodes["n2"].ingero_reason
    assert nodes["n2"].reason == REASON and nodes["n2"].reason_user == "root"
    assert nodes["n2"].reason_time is not None
    assert not any(nodes[n].drained or nodes[n].held_reason for n in ("n1", "n3"))

    backend.resume("n2")
    # 25.11 shows NOT_RESPONDING until the node registers again
    slurm.wait(lambda: not _node(backend, "n2").flags, 30, "n2 back")
    after = _node(backend, "n2")
    assert not after.drained and not after.ingero_reason
    if case.release == "22.05":
        assert "Reason=" not in show_node(slurm, "n2") and after.reason is None
    else:  # 25.11 keeps the last reason after a resume: stale, claiming nothing
        assert after.reason == REASON and after.stale_ingero_reason


def test_the_controller_drains_once(case: Case, slurm: SlurmCluster, backend: SlurmBackend) -> None:
    events: list[Event] = []
    controller = DrainController(CONFIG, backend, events.append, backoff_initial=0.2)
    controller.start()
    try:
        straggler = verdict("n3", cluster_id=case.cluster_name)
        for _ in range(3):
            controller.on_tick(tick(straggler))
            assert controller.wait_idle(60)
    finally:
        controller.stop()
    assert [(e.type, e.node_id, e.extra["backend"]) for e in events] == [
        ("node_drained", "n3", case.backend)
    ]
    assert f"Reason={events[0].extra['reason']} [root@" in show_node(slurm, "n3")
    assert controller.failures == 0


def test_refused_while_slurmctld_is_down_then_retried(
    case: Case, slurm: SlurmCluster, backend: SlurmBackend
) -> None:
    slurm.stop_process("slurmctld")
    quick = make_backend(case.backend, timeout=5)
    for call in (quick.nodes, lambda: quick.drain("n1", REASON)):
        with pytest.raises(SlurmError) as failed:
            call()
        assert "\n" not in str(failed.value)
    cli = subprocess.run(
        [sys.executable, "-m", "ingero.cli.main", "drain", "list", "--backend", case.backend,
         "--timeout", "5"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert cli.returncode == EXIT_UNAVAILABLE, cli.stderr
    assert len(cli.stderr.strip().splitlines()) == 1, cli.stderr

    # The controller keeps going: each failed call is counted and retried, and the drain
    # happens once slurmctld is back.
    events: list[Event] = []
    controller = DrainController(CONFIG, quick, events.append, backoff_initial=0.2, backoff_max=0.5)
    controller.start()
    try:
        controller.on_tick(tick(verdict("n1", cluster_id=case.cluster_name)))
        slurm.wait(lambda: controller.failures >= 1, 60, "a failed, counted Slurm call")
        slurm.start_controller()
        assert controller.wait_idle(120)
    finally:
        controller.stop()
    assert [(e.type, e.node_id) for e in events] == [("node_drained", "n1")]
    assert f"Reason={REASON.split(' job=')[0]}" in show_node(slurm, "n1")
    if isinstance(quick, PyslurmBackend):
        quick.close()


@pytest.mark.parametrize(
    ("call", "slurm_says"),
    [
        (lambda b: b.drain("n9", REASON), "Invalid node name specified"),
        (lambda b: b.resume("n9"), "Invalid node name specified"),
    ],
    ids=["drain", "resume"],
)
def test_unknown_node_is_the_same_one_line_error(
    backend: SlurmBackend, call: object, slurm_says: str
) -> None:
    assert callable(call)
    with pytest.raises(SlurmError) as failed:
        call(backend)
    message = str(failed.value)
    assert message.endswith(slurm_says) and "\n" not in message, message


def test_a_jobs_nodes_in_rank_order(case: Case, slurm: SlurmCluster) -> None:
    out = slurm.root / "out" / f"ranks-{case.backend}-{time.monotonic_ns()}"
    out.parent.mkdir(exist_ok=True)
    job = slurm.run(
        ["sbatch", "--parsable", "-N3", "-o", "/dev/null", "--wrap",
         f"srun -N3 -n3 sh -c 'echo $SLURMD_NODENAME $SLURM_NODEID' > {out}; sleep 120"]
    ).stdout.strip().split(";")[0]  # fmt: skip
    try:
        slurm.wait(lambda: out.exists() and len(out.read_text().split("\n")) > 3, 60, "ranks")
        ranks = dict(line.split() for line in out.read_text().splitlines())
        lookup = make_job_nodes(case.backend, timeout=10)
        assert lookup.name == case.backend
        nodes = lookup.nodes(job)
        assert nodes == sorted(ranks, key=lambda n: int(ranks[n]))
        assert [int(ranks[n]) for n in nodes] == list(range(NODES))
        with pytest.raises(SlurmError) as failed:
            lookup.nodes("999999")
        assert str(failed.value).endswith("Invalid job id specified"), failed.value
    finally:
        slurm.run(["scancel", job], check=False)


# -- pyslurm only ---------------------------------------------------------------------------


@pytest.fixture
def pyslurm_case(case: Case) -> Case:
    if case.backend != "pyslurm":
        pytest.skip("pyslurm only")
    return case


def test_pyslurm_without_slurm_conf_fails_the_call_not_the_process(
    pyslurm_case: Case, slurm: SlurmCluster, tmp_path: Path
) -> None:
    # libslurm retries a missing slurm.conf for 60 s, then exit()s: the call ends at its
    # timeout with libslurm's own words, the worker is stopped, the caller goes on.
    env = {**os.environ, "SLURM_CONF": str(tmp_path / "missing.conf")}
    broken = PyslurmBackend(timeout=3, env=env)
    for _ in range(2):  # and again: a new worker per call until slurm.conf is there
        with pytest.raises(SlurmError) as failed:
            broken.nodes()
        message = str(failed.value)
        assert message.startswith("pyslurm: no answer within 3s while loading: "), message
        assert "missing.conf" in message and "\n" not in message, message
    assert broken._worker is None
    broken.close()


def test_pyslurm_refuses_another_slurm_release(pyslurm_case: Case, slurm: SlurmCluster) -> None:
    mismatched = PyslurmBackend(timeout=10, site_version=lambda: "slurm 22.05.8")
    with pytest.raises(SlurmError, match=r"built for Slurm 25\.11, this host runs Slurm"):
        mismatched.nodes()
    mismatched.close()


def test_pyslurm_call_into_a_frozen_slurmctld_times_out(
    pyslurm_case: Case, slurm: SlurmCluster
) -> None:
    quick = PyslurmBackend(timeout=3)
    assert quick.nodes()
    ctld = slurm.procs["slurmctld"].pid
    os.kill(ctld, signal.SIGSTOP)
    try:
        with pytest.raises(SlurmError, match="no answer within 3s"):
            quick.nodes()
    finally:
        os.kill(ctld, signal.SIGCONT)
    assert {n.name for n in quick.nodes()} == set(slurm.node_names)  # a new worker
    assert quick.restarts == 0  # the stuck one was stopped, not counted as died
    quick.close()
