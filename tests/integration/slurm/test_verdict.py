"""The job's verdict in ``sacct``, on real clusters with slurmdbd and MariaDB: Debian's Slurm
22.05 and the 25.11 build, through both backends (scontrol on both, pyslurm on 25.11).

The real ``ingero fleet`` with ``verdict.enabled`` follows a real ``sbatch`` job from
OTLP pushes naming it (one node straggles) and a node's ``gpu_idle`` events; once the job
ends, ``sacct -j J -o JobID,AdminComment`` shows the site's text, kept, and ingero's part,
which decodes to the straggler, its rank, the idle GPUs and the share lost. A job Fleet
knew nothing of gets nothing. ``ingero verdict backfill`` writes, from a real Echo's
events, the verdict of a job Fleet never saw, and leaves alone a job Echo knows nothing of.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from ingero.otlp.health import NodePush
from ingero.otlp.logs import encode_events
from ingero.schema.events import Event
from ingero.slurm.verdict import decode_part, split_admin_comment
from tests.integration.echo.helpers import EchoProcess
from tests.integration.fleet.helpers import Fleet, start_fleet, wait_for
from tests.integration.slurm import slurm25
from tests.integration.slurm.cluster import MariaDb, SlurmCluster, slurm_cluster
from tests.integration.slurm.test_backends import CASES, Case, _skip_reason, use_env

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
NODES = 4
JOB_NODES = ("n1", "n2", "n3")
SCORES = {"n1": 0.90, "n2": 0.91, "n3": 0.30}
STATS = {"nodes": {"n1": {"cpus": 2, "total_time": 12.5}}, "total_time": 10}
# What a site wrote before ingero: jobstats' JS1 payload where sacctmgr keeps the case, a
# lower-case note where it lowercases every AdminComment (Slurm 22.05).
JS1 = "JS1:" + base64.b64encode(gzip.compress(json.dumps(STATS).encode(), mtime=0)).decode()
NOTE = "site: gpu burn-in passed"


@pytest.fixture(scope="module")
def clusters(mariadb: MariaDb) -> Iterator[dict[str, SlurmCluster]]:
    """One cluster with slurmdbd per release, started when a test first needs it."""
    with ExitStack() as stack:

        class Started(dict[str, SlurmCluster]):
            def __missing__(self, release: str) -> SlurmCluster:
                root = Path(tempfile.mkdtemp(prefix=f"ingero-acct{release}-"))
                root.chmod(0o755)  # munged runs as the munge user
                stack.callback(shutil.rmtree, root, True)
                prefix = slurm25.PREFIX if release == "25.11" else None
                name = "acct" + release.replace(".", "")
                cluster = stack.enter_context(
                    slurm_cluster(root, NODES, cluster_name=name, prefix=prefix, accounting=mariadb)
                )
                (root / "flags").mkdir()
                self[release] = cluster
                return cluster

        yield Started()


@pytest.fixture(params=CASES, ids=lambda c: f"{c.backend}-{c.release}")
def case(request: pytest.FixtureRequest) -> Case:
    reason = _skip_reason(request.param)
    if reason:
        pytest.skip(reason)
    if request.param.release == "25.11" and not (slurm25.PREFIX / "sbin" / "slurmdbd").exists():
        pytest.skip(f"{slurm25.PREFIX} has no slurmdbd (tests/slurm25/build.sh builds it)")
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def slurm(
    case: Case, clusters: dict[str, SlurmCluster], monkeypatch: pytest.MonkeyPatch
) -> SlurmCluster:
    """The case's cluster, its environment in this process's (Fleet and the commands the
    test runs inherit it)."""
    cluster = clusters[case.release]
    use_env(cluster, monkeypatch)
    cluster.wait_idle()
    return cluster


class Job:
    """An sbatch job that runs until the test ends it."""

    def __init__(self, slurm: SlurmCluster, nodes: tuple[str, ...]) -> None:
        self.slurm = slurm
        self.flag = slurm.root / "flags" / uuid.uuid4().hex
        script = f"while [ ! -e {self.flag} ]; do sleep 0.2; done"
        self.id = slurm.run(
            ["sbatch", "--parsable", "-N", str(len(nodes)), "-w", ",".join(nodes),
             "-o", "/dev/null", "--wrap", script],
        ).stdout.strip().split(";")[0]  # fmt: skip
        slurm.wait(lambda: self.state() == "RUNNING", 60, f"job {self.id} to run")

    def state(self) -> str:
        out = self.slurm.run(["squeue", "-h", "-j", self.id, "-o", "%T"], check=False).stdout
        return out.strip() or "GONE"

    def end(self) -> None:
        self.flag.touch()
        self.slurm.wait(lambda: self.accounted()[0] == "COMPLETED", 60, f"job {self.id} in sacct")

    def accounted(self) -> tuple[str, str]:
        """(State, AdminComment) as sacct reads them back through slurmdbd."""
        out = self.slurm.run(
            ["sacct", "-X", "-n", "-P", "-j", self.id, "-o", "State,AdminComment"], check=False
        ).stdout.strip()
        state, _, comment = out.partition("|")
        return state, comment


def push(fleet: Fleet, cluster: str, job: str | None) -> None:
    reply = fleet.push(
        NodePush(
            node_id=n,
            cluster_id=cluster,
            score=s,
            job_id=job,
            rank=int(n[1:]) - 1 if job else None,
            world_size=len(SCORES) if job else None,
            workload_type="training",
            dominant_signal="cpu",
        )
        for n, s in SCORES.items()
    )
    assert reply.status == 200, reply


def idle_event(cluster: str, job: str, state: str, event_id: str, since: float) -> Event:
    extra: dict[str, object] = {
        "state": state,
        "gpus": [0, 1],
        "user": "root",
        "since": since,
        "reason": "no_process",
    }
    if state == "end":
        extra["idle_s"] = time.time() - since
    return Event(
        type="gpu_idle",
        node_id="n2",
        cluster_id=cluster,
        timestamp=time.time(),
        event_id=event_id,
        job_id=job,
        extra=extra,
    )


def test_fleet_writes_the_verdict_of_each_job_it_followed(
    case: Case, slurm: SlurmCluster, tmp_path: Path
) -> None:
    fleet = start_fleet(
        tmp_path,
        {
            "verdict": {"enabled": True, "backend": case.backend, "retry": "0.5s"},
            "quorum": {"statistical_min": 3},
            "threshold": {"ema_alpha": 1.0, "panic_fraction": 0.5},
        },
    )
    try:
        job = Job(slurm, JOB_NODES)
        unknown = Job(slurm, ("n4",))  # no push names it
        lowered = case.release == "22.05"  # its sacctmgr lowercases what it sets
        site = NOTE if lowered else JS1
        # The site's own text, set while the job runs (slurmctld keeps it for accounting).
        slurm.run(["scontrol", "update", f"jobid={job.id}", f"AdminComment={site}"])
        idle_id = str(uuid.uuid4())
        since = time.time()
        assert fleet.post_logs([idle_event(slurm.cluster_name, job.id, "start", idle_id, since)])
        wait_for(
            lambda: (
                push(fleet, slurm.cluster_name, job.id) or "straggler_state: node n3" in fleet.log()
            ),
            60,
            "fleet to find the straggler",
        )
        for _ in range(10):  # the episode lasts a while
            push(fleet, slurm.cluster_name, job.id)
            time.sleep(0.1)
        fleet.post_logs([idle_event(slurm.cluster_name, job.id, "end", idle_id, since)])
        job.end()
        unknown.end()
        # its nodes push with no job now: the group is gone, the writer asks sacct

        def written() -> str:
            push(fleet, slurm.cluster_name, None)
            return job.accounted()[1] if "ingero:" in job.accounted()[1] else ""

        try:
            comment = wait_for(written, 60, "the verdict in sacct")
        except AssertionError:
            print("\n".join(ln for ln in fleet.log().splitlines() if "verdict" in ln))
            raise
        site_back, part = split_admin_comment(comment)
        assert site_back == site  # the site's text, kept as it was
        verdict = decode_part(part or "")
        assert (verdict["job"], verdict["cluster"]) == (job.id, slurm.cluster_name)
        assert [(r["node"], r["rank"]) for r in verdict["stragglers"]] == [("n3", 2)]
        assert verdict["stragglers"][0]["s"] > 0 and 0 < verdict["lost_share"] <= 1
        assert verdict["worst"]["node"] == "n3"
        assert verdict["gpu_idle"]["nodes"][0]["node"] == "n2"
        assert verdict["gpu_idle"]["gpu_s"] > 0 and verdict["nodes"] == 3
        assert (" INGERO1B32:" if lowered else " INGERO1:") in comment.upper()
        assert "1 straggler node (n3 r2" in comment
        if not lowered:  # jobstats' own reader still decodes its part
            assert json.loads(gzip.decompress(base64.b64decode(comment[4:]))) == STATS
        shown = subprocess.run(
            [sys.executable, "-m", "ingero.cli.main", "verdict", "show", job.id,
             "--backend", case.backend, "--json"],
            capture_output=True, text=True, timeout=60, cwd=REPO,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["verdict"] == verdict
        assert unknown.accounted() == ("COMPLETED", "")  # Fleet knew nothing of it
        assert fleet.metric("ingero_fleet_verdicts_total", outcome="written") == 1
    finally:
        assert fleet.stop() == 0


# The backfill writes as Fleet does: one case per backend is enough.
@pytest.mark.parametrize(
    "case", [CASES[0], CASES[2]], indirect=True, ids=lambda c: f"{c.backend}-{c.release}"
)
def test_backfill_writes_from_echo_what_fleet_missed(
    case: Case, slurm: SlurmCluster, tmp_path: Path
) -> None:
    (tmp_path / "echo").mkdir()
    echo = EchoProcess(tmp_path / "echo", tokens=False).start()
    try:
        missed = Job(slurm, JOB_NODES)  # ran while Fleet was away; Echo has its events
        strange = Job(slurm, ("n4",))  # nothing of ingero ever saw it
        episode = str(uuid.uuid4())
        start = time.time()
        common = {"cluster_id": slurm.cluster_name, "job_id": missed.id, "event_id": episode}
        events = [
            Event(type="straggler_state", node_id="n1", timestamp=start, rank=0, score=0.3,
                  threshold=0.8, extra={"cause_class": "node"}, **common),
            Event(type="straggler_resolved", node_id="n1", timestamp=start + 2, rank=0,
                  extra={"reason": "recovered", "since": start}, **common),
        ]  # fmt: skip
        time.sleep(2)
        # as Fleet's forwarder sends them: OTLP/HTTP logs, acknowledged once stored
        request = urllib.request.Request(
            f"http://{echo.otlp_http}/v1/logs",
            data=encode_events(events).SerializeToString(),
            headers={"Content-Type": "application/x-protobuf"},
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200
        missed.end()
        strange.end()

        def backfill() -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "ingero.cli.main", "verdict", "backfill",
                 "--echo", echo.url, "--since", "1h", "--backend", case.backend],
                capture_output=True, text=True, timeout=120, cwd=REPO,
                env={**os.environ, "INGERO_ECHO_TOKEN": ""},
            )  # fmt: skip

        first = backfill()
        assert first.returncode == 0, first.stderr
        assert f"job {missed.id}: written:" in first.stdout, first.stdout
        assert f"job {strange.id}: unknown:" in first.stdout, first.stdout
        verdict = decode_part(missed.accounted()[1])
        assert [(r["node"], r["class"]) for r in verdict["stragglers"]] == [("n1", "node")]
        assert strange.accounted() == ("COMPLETED", "")
        again = backfill()
        assert f"job {missed.id}: has_verdict:" in again.stdout, again.stdout
    finally:
        echo.stop()
