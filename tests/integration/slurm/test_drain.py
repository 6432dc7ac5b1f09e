"""The drain controller against the real cluster: a real ScontrolBackend driven by Fleet's
own verdict types (synthetic ticks), ``ingero drain`` as a process, and the real
``ingero fleet`` daemon with ``drain.enabled`` fed by OTLP pushes."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ingero.fleet.model import NodeReport, NodeVerdict, PeerLagCause, TickResult
from ingero.otlp.health import NodePush
from ingero.schema.events import Event
from ingero.slurm.backend import NodeInfo
from ingero.slurm.drain import DrainController
from ingero.slurm.drain_policy import DrainConfig, IdleResumeConfig
from ingero.slurm.scontrol_backend import ScontrolBackend
from tests.integration.fleet.helpers import Fleet, start_fleet, wait_for
from tests.integration.slurm.cluster import SlurmCluster

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
# 4 nodes: max_fraction 0.25 lets ingero hold one drained node.
CONFIG = DrainConfig(enabled=True, max_fraction=0.25, min_intervals=2, cooldown=0)
ADMIN = "admin: bad DIMM, ticket 42"


def verdict(node: str, score: float = 0.30, **kw: object) -> NodeVerdict:
    fields: dict[str, object] = {
        "node_id": node,
        "cluster_id": "ingerotest",
        "group": "ingerotest/job/41",
        "job_id": "41",
        "rank": int(node[1:]) - 1,
        "score": score,
        "threshold": 0.86,
        "straggler": True,
        "consecutive_straggler_ticks": 3,
        "since": 1_795_000_000.0,
        "panic": False,
        "quorum_met": True,
        "dominant_signal": "compute",
        "cause_class": "hardware",
    }
    fields.update(kw)
    return NodeVerdict(**fields)  # type: ignore[arg-type]


def tick(*verdicts: NodeVerdict, events: tuple[Event, ...] = ()) -> TickResult:
    return TickResult(
        computed_at=time.time(), groups=(), verdicts=verdicts, events=events, expired_nodes=()
    )


def resolved(node: str, reason: str) -> Event:
    """Fleet's event for a straggler episode that ended this tick, and why."""
    return Event(
        type="straggler_resolved",
        node_id=node,
        cluster_id="ingerotest",
        timestamp=time.time(),
        extra={"reason": reason, "panic": False, "group": "ingerotest/job/41"},
    )


def nodes(slurm: SlurmCluster) -> dict[str, NodeInfo]:
    return {n.name: n for n in ScontrolBackend(timeout=10).nodes()}


class Run:
    """A started controller with a real backend, collecting its events."""

    def __init__(self, config: DrainConfig, timeout: float = 10, report: Any = None) -> None:
        self.events: list[Event] = []
        self.backend = ScontrolBackend(timeout=timeout)
        self.controller = DrainController(
            config,
            self.backend,
            self.events.append,
            backoff_initial=0.2,
            backoff_max=1.0,
            report=report,
        )
        self.controller.start()

    def tick(self, *verdicts: NodeVerdict, events: tuple[Event, ...] = ()) -> None:
        self.controller.on_tick(tick(*verdicts, events=events))
        assert self.controller.wait_idle(60), "the controller did not finish the tick"

    def of(self, kind: str) -> list[tuple[str, str]]:
        return [(e.node_id, str(e.extra.get("skip", ""))) for e in self.events if e.type == kind]


@pytest.fixture
def run(slurm: SlurmCluster) -> Iterator[type[Run]]:
    started: list[Run] = []

    class Tracked(Run):
        def __init__(self, config: DrainConfig, timeout: float = 10, report: Any = None) -> None:
            super().__init__(config, timeout, report)
            started.append(self)

    yield Tracked
    for item in started:
        item.controller.stop()


def test_drains_exactly_the_straggler_with_an_ingero_reason(
    slurm: SlurmCluster, run: type[Run]
) -> None:
    r = run(CONFIG)
    r.tick(verdict("n2", consecutive_straggler_ticks=1))
    assert not any(n.drained for n in nodes(slurm).values())  # min_intervals not reached
    r.tick(verdict("n2"))
    state = nodes(slurm)
    assert [name for name, n in state.items() if n.drained] == ["n2"]
    reason = (
        "ingero: straggler score=0.30 threshold=0.86 job=41 since=2026-11-18T11:06:40Z"
        " class=hardware"
    )
    assert state["n2"].reason == reason
    assert r.of("node_drained") == [("n2", "")]
    (event,) = [e for e in r.events if e.type == "node_drained"]
    assert (event.job_id, event.rank, event.score, event.extra["reason"]) == ("41", 1, 0.30, reason)
    # as an operator sees it
    show = slurm.run(["scontrol", "show", "node", "n2"]).stdout
    assert f"Reason={reason} [" in show and "DRAIN" in show
    sinfo = slurm.run(["sinfo", "-R", "-h", "-o", "%N|%E"]).stdout.splitlines()
    assert sinfo == [f"n2|{reason}"]
    # the next tick leaves it as it is (already drained by ingero): no new decision
    r.tick(verdict("n2", score=0.1))
    assert nodes(slurm)["n2"].reason == reason and len(r.events) == 1


def test_a_peer_lag_drain_names_the_rank_and_stays_ingeros(
    slurm: SlurmCluster, run: type[Run]
) -> None:
    # Fleet's verdict for a node straggling by NCCL peer lag alone: its score is above the
    # threshold, so a score reason would mislead whoever reads `scontrol show node`.
    lag = PeerLagCause(comm_hash="0123456789abcdef", comm_rank=2, lag_s=0.19997)
    r = run(CONFIG)
    r.tick(verdict("n3", score=0.95, reason="peer_lag", peer_lag=lag))
    reason = "ingero: peer_lag rank 2 of comm 0123456789abcdef 200 ms late (job 41) class=hardware"
    show = slurm.run(["scontrol", "show", "node", "n3"]).stdout
    assert f"Reason={reason} [" in show and "DRAIN" in show
    (event,) = [e for e in r.events if e.type == "node_drained"]
    assert event.extra["reason"] == reason
    # still ingero's own drain: listed as ingero's, resumable by `ingero drain resume`
    rows = json.loads(ingero("drain", "list", "--json").stdout)
    assert [(row["node"], row["owner"], row["reason"]) for row in rows] == [
        ("n3", "ingero", reason)
    ]
    done = ingero("drain", "resume", "n3")
    assert done.returncode == 0, done.stderr
    assert not nodes(slurm)["n3"].drained


def test_a_node_drained_by_someone_else_keeps_its_reason(
    slurm: SlurmCluster, run: type[Run]
) -> None:
    slurm.run(["scontrol", "update", "nodename=n3", "state=drain", f"reason={ADMIN}"])
    r = run(CONFIG)
    r.tick(verdict("n3"))
    r.tick(verdict("n3"))
    assert nodes(slurm)["n3"].reason == ADMIN
    assert r.of("drain_skipped") == [("n3", "foreign_reason")]  # once, not every tick


def test_max_fraction_stops_a_second_drain(slurm: SlurmCluster, run: type[Run]) -> None:
    r = run(CONFIG)
    r.tick(verdict("n2", score=0.2), verdict("n3", score=0.4))
    drained = sorted(name for name, n in nodes(slurm).items() if n.drained)
    assert drained == ["n2"]
    assert r.of("drain_skipped") == [("n3", "max_fraction")]
    # a second controller (say, after a restart) counts what Slurm says ingero holds
    r2 = run(CONFIG)
    r2.tick(verdict("n4"))
    assert not nodes(slurm)["n4"].drained and r2.of("drain_skipped") == [("n4", "max_fraction")]


def test_panic_drains_nothing(slurm: SlurmCluster, run: type[Run]) -> None:
    r = run(CONFIG)
    r.tick(verdict("n2", panic=True), verdict("n3", panic=True))
    assert not any(n.drained for n in nodes(slurm).values())
    assert r.of("drain_skipped") == [("n2", "panic"), ("n3", "panic")]


def test_a_node_of_the_same_name_in_another_cluster_is_not_drained(
    slurm: SlurmCluster, run: type[Run]
) -> None:
    r = run(CONFIG)
    r.tick(verdict("n2", cluster_id="othercluster"))
    assert not any(n.drained for n in nodes(slurm).values()) and r.events == []


def test_no_quorum_drains_nothing(slurm: SlurmCluster, run: type[Run]) -> None:
    r = run(CONFIG)
    r.tick(verdict("n2", quorum_met=False))
    assert not any(n.drained for n in nodes(slurm).values())
    assert r.of("drain_skipped") == [("n2", "no_quorum")]


def test_dry_run_changes_nothing(slurm: SlurmCluster, run: type[Run]) -> None:
    before = nodes(slurm)
    r = run(dataclasses.replace(CONFIG, dry_run=True, auto_resume=True))
    r.tick(verdict("n2"))
    r.tick(verdict("n2"))
    assert nodes(slurm) == before
    (event,) = r.events
    assert (event.type, event.extra["skip"], event.extra["dry_run"]) == (
        "drain_skipped",
        "dry_run",
        True,
    )
    assert "would drain with reason 'ingero: straggler score=0.30" in event.extra["reason"]


def ingero(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ingero.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ.copy(),
        cwd=REPO,
    )


def test_resume_restores_only_ingero_nodes(slurm: SlurmCluster, run: type[Run]) -> None:
    slurm.run(["scontrol", "update", "nodename=n3", "state=drain", f"reason={ADMIN}"])
    r = run(CONFIG)
    r.tick(verdict("n2"))
    listed = ingero("drain", "list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split()[0] == "n2" and "n3" not in listed.stdout
    assert "ingero: straggler score=0.30" in listed.stdout
    as_json = ingero("drain", "list", "--json")
    assert as_json.returncode == 0, as_json.stderr
    rows = json.loads(as_json.stdout)
    assert [(r["node"], r["owner"], r["drained"]) for r in rows] == [("n2", "ingero", True)]
    assert rows[0]["reason"].startswith("ingero: straggler score=0.30")
    everyone = json.loads(ingero("drain", "list", "--json", "--all").stdout)
    assert {r["node"]: r["owner"] for r in everyone} == {"n2": "ingero", "n3": "other"}

    refused = ingero("drain", "resume", "n3")
    assert refused.returncode == 2 and "not written by ingero" in refused.stderr
    assert nodes(slurm)["n3"].reason == ADMIN
    unknown = ingero("drain", "resume", "n99")
    assert unknown.returncode != 0 and "no node named" in unknown.stderr

    done = ingero("drain", "resume", "n2")
    assert done.returncode == 0, done.stderr
    state = nodes(slurm)
    assert not state["n2"].drained and state["n2"].reason is None
    assert state["n3"].drained and state["n3"].reason == ADMIN
    assert "no nodes drained by ingero" in ingero("drain", "list").stdout
    assert json.loads(ingero("drain", "list", "--json").stdout) == []


def test_auto_resume_after_recovery(slurm: SlurmCluster, run: type[Run]) -> None:
    slurm.run(["scontrol", "update", "nodename=n3", "state=drain", f"reason={ADMIN}"])
    r = run(dataclasses.replace(CONFIG, auto_resume=True))
    r.tick(verdict("n2"))
    assert nodes(slurm)["n2"].drained
    r.tick()  # not listed, but no evidence of recovery: stays drained
    assert nodes(slurm)["n2"].drained
    r.tick(events=(resolved("n2", "recovered"),))  # the first of min_intervals: not yet
    assert nodes(slurm)["n2"].drained
    r.tick()
    state = nodes(slurm)
    assert not state["n2"].drained and state["n3"].reason == ADMIN
    assert r.of("node_resumed") == [("n2", "")]


def test_no_auto_resume_when_the_episode_ended_idle(slurm: SlurmCluster, run: type[Run]) -> None:
    r = run(dataclasses.replace(CONFIG, auto_resume=True))
    r.tick(verdict("n2"))
    assert nodes(slurm)["n2"].drained
    # the drained node's job ended: Fleet ends its episode "inactive", which proves nothing
    r.tick(events=(resolved("n2", "inactive"),))
    for _ in range(4):
        r.tick()
    state = nodes(slurm)
    assert state["n2"].drained and state["n2"].reason is not None
    assert state["n2"].reason.startswith("ingero: straggler")
    assert r.of("node_resumed") == []


def verify_script(tmp_path: Path, exit_code: int) -> Path:
    """The site's check: records which node it was asked about, exits ``exit_code``."""
    path = tmp_path / f"verify-{exit_code}"
    path.write_text(
        f'#!/bin/sh\necho "$1" >> {tmp_path}/verified\necho "burn-in: $1"\nexit {exit_code}\n'
    )
    path.chmod(0o755)
    return path


def idle_config(command: Path, budget: int = 1) -> DrainConfig:
    idle = IdleResumeConfig(enabled=True, clean_for=1.0, budget=budget, command=str(command))
    return dataclasses.replace(CONFIG, max_fraction=0.5, resume_idle=idle)


def quiet_node(cluster: str, node: str) -> NodeReport:
    """Fleet's word on every node here: it pushes, idle, its agent finds no hardware cause."""
    return NodeReport("idle", "job")


def tick_for(r: Run, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        r.tick()
        time.sleep(0.2)


def test_an_idle_drained_node_comes_back_once_verified_within_the_budget(
    slurm: SlurmCluster, run: type[Run], tmp_path: Path
) -> None:
    slurm.run(["scontrol", "update", "nodename=n3", "state=drain", f"reason={ADMIN}"])
    flag = slurm.root / "out" / "n2-job-done"
    slurm.run(
        ["sbatch", "--parsable", "-w", "n2", "-o", "/dev/null",
         "--wrap", f"while [ ! -e {flag} ]; do sleep 0.2; done"],
    )  # fmt: skip
    try:
        slurm.wait(lambda: "n2" not in slurm.idle_nodes(), 30, "the job on n2")
        r = run(idle_config(verify_script(tmp_path, 0)), report=quiet_node)
        r.tick(verdict("n2"))
        assert nodes(slurm)["n2"].drained and nodes(slurm)["n2"].state != "idle"  # DRAINING
        tick_for(r, 2.5)  # clean for longer than clean_for, but its job still runs
        assert nodes(slurm)["n2"].drained and r.of("node_resumed") == []
    finally:
        flag.touch()
    slurm.wait(lambda: nodes(slurm)["n2"].state == "idle", 60, "n2 IDLE+DRAIN")
    assert nodes(slurm)["n2"].drained
    wait_for(lambda: tick_for(r, 0.5) or r.of("node_resumed"), 30, "the verified resume")
    state = nodes(slurm)
    assert not state["n2"].drained and not state["n2"].held_reason
    assert (tmp_path / "verified").read_text().split() == ["n2"]
    (resumed,) = [e for e in r.events if e.type == "node_resumed"]
    site = resumed.extra["verification"]["site_check"]
    assert site["exit"] == 0 and site["output"] == "burn-in: n2" and site["command"][-1] == "n2"
    assert "verified: GPU health clean for " in resumed.extra["reason"]
    # an admin's reason: never, however long it has been idle
    assert state["n3"].reason == ADMIN and state["n3"].drained
    # the budget (1 an hour) is spent: the next idle node ingero drained stays so, said once
    r.tick(verdict("n1"))
    assert nodes(slurm)["n1"].drained
    tick_for(r, 2.0)
    assert r.of("drain_skipped") == [("n1", "resume_budget")]
    assert nodes(slurm)["n1"].drained and r.controller.idle_outcomes == {
        ("resumed", "verified"): 1,
        ("refused", "resume_budget"): 1,
    }
    slurm.run(["scontrol", "update", "nodename=n3", "state=resume"])


def test_an_idle_drained_node_whose_check_fails_stays_drained(
    slurm: SlurmCluster, run: type[Run], tmp_path: Path
) -> None:
    r = run(idle_config(verify_script(tmp_path, 1), budget=5), report=quiet_node)
    r.tick(verdict("n4"))
    assert nodes(slurm)["n4"].drained
    wait_for(lambda: tick_for(r, 0.5) or r.of("drain_skipped"), 30, "the failed check")
    assert r.of("drain_skipped") == [("n4", "verify_failed")]
    (refused,) = [e for e in r.events if e.type == "drain_skipped"]
    assert refused.extra["verification"]["site_check"]["exit"] == 1
    assert "burn-in: n4" in refused.extra["reason"]
    state = nodes(slurm)["n4"]
    assert state.drained and state.reason is not None and state.reason.startswith("ingero:")


# ---- the real ingero fleet daemon -------------------------------------------------


def push_all(fleet: Fleet, scores: dict[str, float], job: str = "41") -> None:
    reply = fleet.push(
        NodePush(
            node_id=n,
            cluster_id="ingerotest",
            score=s,
            job_id=job,
            rank=int(n[1:]) - 1,
            world_size=4,
            workload_type="training",
        )
        for n, s in scores.items()
    )
    assert reply.status == 200, reply


FLEET_DRAIN = {
    "drain": {"enabled": True, "max_fraction": 0.25, "min_intervals": 3, "cooldown": "0s"},
    "quorum": {"statistical_min": 3},
    "threshold": {"ema_alpha": 1.0, "panic_fraction": 0.3},
}
SCORES = {"n1": 0.90, "n2": 0.91, "n3": 0.30, "n4": 0.92}


def start_drain_fleet(
    tmp_path: Path, slurm: SlurmCluster, extra: dict[str, object] | None = None
) -> Fleet:
    return start_fleet(
        tmp_path, {**FLEET_DRAIN, **(extra or {})}, env={"SLURM_CONF": str(slurm.conf)}
    )


def test_fleet_drains_the_straggler_of_a_job(slurm: SlurmCluster, tmp_path: Path) -> None:
    fleet = start_drain_fleet(tmp_path, slurm)
    try:

        def drained() -> list[str]:
            push_all(fleet, SCORES)
            return [name for name, n in nodes(slurm).items() if n.drained]

        assert wait_for(drained, 60, "fleet to drain n3") == ["n3"]
        reason = nodes(slurm)["n3"].reason
        assert reason is not None and reason.startswith("ingero: straggler score=0.30 threshold=0.")
        assert " job=41 since=" in reason
        wait_for(lambda: "ingero node_drained: node n3 job 41" in fleet.log(), 20, "the event")
        for _ in range(10):  # it stays the only one
            push_all(fleet, SCORES)
        assert [name for name, n in nodes(slurm).items() if n.drained] == ["n3"]
    finally:
        assert fleet.stop() == 0


def test_fleet_resumes_an_idle_node_it_drained_once_verified(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """The wiring of drain.resume_idle in the real daemon: Fleet's own node reports (the
    idle pushes' cause class) prove the node clean, the site's check runs, n3 comes back."""
    idle = {"enabled": True, "clean_for": "1s", "command": str(verify_script(tmp_path, 0))}
    fleet = start_drain_fleet(
        tmp_path, slurm, {"drain": {**FLEET_DRAIN["drain"], "resume_idle": idle}}
    )
    try:
        wait_for(lambda: push_all(fleet, SCORES) or nodes(slurm)["n3"].drained, 60, "n3 drained")

        def resumed() -> bool:
            # the job ended: every node pushes idle, its agent finds no hardware cause
            reply = fleet.push(
                NodePush(node_id=n, cluster_id="ingerotest", score=0.9, state="idle",
                         cause_class="job")
                for n in SCORES
            )  # fmt: skip
            assert reply.status == 200, reply
            return not nodes(slurm)["n3"].drained

        wait_for(resumed, 60, "n3 resumed")
        assert (tmp_path / "verified").read_text().split() == ["n3"]
        wait_for(
            lambda: "resumed idle n3: idle with GPU health clean for" in fleet.log(), 20, "log"
        )
        assert fleet.metric("ingero_fleet_idle_resumes_total", outcome="resumed") == 1
    finally:
        assert fleet.stop() == 0


def test_fleet_in_panic_drains_nothing(slurm: SlurmCluster, tmp_path: Path) -> None:
    # 8 nodes push (n5-n8 are not Slurm nodes), 2 of them low: 2/8 > panic_fraction 0.2
    fleet = start_drain_fleet(
        tmp_path, slurm, {"threshold": {"ema_alpha": 1.0, "panic_fraction": 0.2}}
    )
    try:
        panic = {**SCORES, "n2": 0.3, "n5": 0.9, "n6": 0.91, "n7": 0.92, "n8": 0.9}
        wait_for(
            lambda: push_all(fleet, panic) or "drain_skipped" in fleet.log(), 60, "a panic skip"
        )
        assert "group_degraded" in fleet.log()
        assert "the node's group is degraded as a whole (panic)" in fleet.log()
        assert not any(n.drained for n in nodes(slurm).values())
    finally:
        assert fleet.stop() == 0


def test_fleet_dry_run_changes_nothing(slurm: SlurmCluster, tmp_path: Path) -> None:
    fleet = start_drain_fleet(tmp_path, slurm, {"drain": {**FLEET_DRAIN["drain"], "dry_run": True}})
    try:
        before = nodes(slurm)
        wait_for(
            lambda: push_all(fleet, SCORES) or "would drain with reason" in fleet.log(),
            60,
            "a dry-run decision",
        )
        # the event leaves through Fleet's event exit point on a later tick
        wait_for(lambda: "ingero drain_skipped: node n3 job 41" in fleet.log(), 20, "the event")
        assert nodes(slurm) == before
    finally:
        assert fleet.stop() == 0


def test_fleet_keeps_a_reason_it_did_not_write(slurm: SlurmCluster, tmp_path: Path) -> None:
    slurm.run(["scontrol", "update", "nodename=n3", "state=drain", f"reason={ADMIN}"])
    fleet = start_drain_fleet(tmp_path, slurm)
    try:
        wait_for(
            lambda: push_all(fleet, SCORES) or "a reason ingero did not write" in fleet.log(),
            60,
            "a foreign-reason skip",
        )
        state = nodes(slurm)
        assert state["n3"].reason == ADMIN
        assert [name for name, n in state.items() if n.drained] == ["n3"]
    finally:
        assert fleet.stop() == 0


def test_stopped_slurm_controller_does_not_stall_ingestion(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    ctld = slurm.procs["slurmctld"]
    fleet = start_drain_fleet(tmp_path, slurm)
    try:
        os.kill(ctld.pid, signal.SIGSTOP)  # every Slurm call now hangs until its timeout
        try:
            computed: set[float] = set()

            def stalled_while_serving() -> bool:
                push_all(fleet, SCORES)  # each push is answered (status 200)
                reply = fleet.threshold("ingerotest", "41")
                if reply.status == 200:  # 404 until the first tick saw the group
                    computed.add(reply.json()["computed_at"])
                # Slurm's own MessageTimeout (5s here) or ingero's (10s) ends each call.
                return "drain controller:" in fleet.log() and "retrying in" in fleet.log()

            try:
                wait_for(stalled_while_serving, 60, "a timed-out Slurm call")
            except AssertionError:
                print(fleet.log()[-3000:])
                raise
            # ticks went on while the drain worker waited on Slurm
            assert len(computed) > 5
            # and /metrics counts the failed call (what the DrainFailing alert watches)
            assert fleet.metric("ingero_fleet_drain_failures_total") >= 1
            assert fleet.proc.poll() is None
        finally:
            os.kill(ctld.pid, signal.SIGCONT)

        def drained() -> bool:
            push_all(fleet, SCORES)
            return bool(nodes(slurm)["n3"].drained)

        wait_for(drained, 90, "the retried drain after slurmctld came back")
        assert nodes(slurm)["n3"].reason.startswith("ingero: straggler")  # type: ignore[union-attr]
    finally:
        assert fleet.stop() == 0
