"""Idle drained nodes that come back when proven safe (``drain.resume_idle``): the pure
policy with an injected clock, then the controller's verification (a real site command,
with its timeout) against a stand-in Slurm."""

from __future__ import annotations

import dataclasses
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest

from ingero.fleet.model import NodeReport, TickResult
from ingero.runtime.clock import ManualClock
from ingero.schema.events import Event
from ingero.slurm.backend import NodeInfo
from ingero.slurm.drain import DrainController
from ingero.slurm.drain_policy import (
    GPU_UNHEALTHY,
    NO_HEALTH_EVIDENCE,
    RESUME_BUDGET,
    VERIFY,
    DrainConfig,
    DrainMemory,
    IdleResumeConfig,
    gpu_fault,
    idle_resumes,
    observe_health,
)
from tests.unit.slurm.test_drain_controller import StandInSlurm

REASON = "ingero: straggler score=0.30 threshold=0.80 job=1 since=x class=hardware"
IDLE = IdleResumeConfig(enabled=True, clean_for=600.0, budget=2)
CONFIG = DrainConfig(enabled=True, cooldown=0, resume_idle=IDLE)
CLEAN = NodeReport("idle", "job")


def drained(name: str, state: str = "idle", reason: str = REASON, **kw: object) -> NodeInfo:
    return NodeInfo(name, state, frozenset({"DRAIN", *kw.pop("flags", ())}), reason)  # type: ignore[arg-type]


def look(memory: DrainMemory, nodes: list[NodeInfo], now: float, report: NodeReport | None = CLEAN):
    for info in nodes:
        observe_health(memory, info.name, report, now)
    return [(d.node, d.action, d.code) for d in idle_resumes(nodes, CONFIG, memory, now, "c")]


def test_an_idle_node_ingero_drained_is_resumed_after_clean_for() -> None:
    memory, nodes = DrainMemory(), [drained("n2")]
    assert look(memory, nodes, 0.0) == []
    assert look(memory, nodes, 599.0) == []  # clean, but not for long enough yet
    assert look(memory, nodes, 600.0) == [("n2", "resume", VERIFY)]


@pytest.mark.parametrize(
    "node",
    [
        drained("n2", reason="admin: bad DIMM, ticket 42"),  # an admin's reason: never
        drained("n2", reason="NHC: check_gpu: GPU 3 lost"),  # NHC's own drain
        drained("n2", state="mixed"),  # DRAINING: its job still runs
        drained("n2", state="allocated"),
        drained("n2", state="down"),
        drained("n2", flags={"REBOOT_REQUESTED"}),
        NodeInfo("n2", "idle"),  # not drained at all
    ],
)
def test_never_a_node_whose_job_runs_or_whose_reason_is_someone_elses(node: NodeInfo) -> None:
    memory = DrainMemory()
    for t in (0.0, 700.0, 5000.0):
        assert look(memory, [node], t) == []


def test_no_evidence_or_a_gpu_fault_restarts_the_clean_time() -> None:
    memory, nodes = DrainMemory(), [drained("n2")]
    look(memory, nodes, 0.0)
    # a stale or silent node proves nothing, and says so once
    assert look(memory, nodes, 300.0, None) == [("n2", "skip", NO_HEALTH_EVIDENCE)]
    assert look(memory, nodes, 301.0, NodeReport("stale", "job")) == []
    assert look(memory, nodes, 302.0, NodeReport("idle", None)) == []  # an old agent
    look(memory, nodes, 400.0)
    assert look(memory, nodes, 999.0) == []  # clean since 400 only
    assert look(memory, nodes, 1000.0) == [("n2", "resume", VERIFY)]
    memory = DrainMemory()
    look(memory, nodes, 0.0)
    assert look(memory, nodes, 300.0, NodeReport("idle", "hardware")) == [
        ("n2", "skip", GPU_UNHEALTHY)
    ]
    look(memory, nodes, 400.0)
    gpu_fault(memory, "n2")  # an XID between two ticks
    assert [c for *_, c in look(memory, nodes, 1100.0)] == []  # clean again from 1100
    assert look(memory, nodes, 1700.0) == [("n2", "resume", VERIFY)]


def test_the_budget_bounds_resumes_per_hour() -> None:
    memory = DrainMemory()
    nodes = [drained(f"n{i}") for i in range(1, 5)]
    look(memory, nodes, 0.0)
    first = look(memory, nodes, 600.0)
    assert first == [
        ("n1", "resume", VERIFY),
        ("n2", "resume", VERIFY),
        ("n3", "skip", RESUME_BUDGET),
        ("n4", "skip", RESUME_BUDGET),
    ]
    nodes = nodes[2:]  # n1, n2 are back in service
    assert look(memory, nodes, 1200.0) == []  # the refusal is reported once
    assert look(memory, nodes, 600.0 + 3600.0) == [
        ("n3", "resume", VERIFY),
        ("n4", "resume", VERIFY),
    ]


def test_off_or_dry_run_resumes_nothing() -> None:
    memory, nodes = DrainMemory(), [drained("n2")]
    for config in (DrainConfig(enabled=True), dataclasses.replace(CONFIG, enabled=False)):
        observe_health(memory, "n2", CLEAN, 0.0)
        assert idle_resumes(nodes, config, memory, 5000.0) == []
    dry = dataclasses.replace(CONFIG, dry_run=True)
    observe_health(memory, "n2", CLEAN, 0.0)
    (d,) = idle_resumes(nodes, dry, memory, 5000.0)
    assert (d.action, d.code) == ("skip", "dry_run") and "would verify and resume" in d.reason
    assert idle_resumes(nodes, dry, memory, 5001.0) == []


# -- the controller: verification, resume or refusal, events and counts -------------------


@dataclass
class Reports:
    said: dict[str, NodeReport]

    def __call__(self, cluster: str, node: str) -> NodeReport | None:
        return self.said.get(node) if cluster == "c" else None


def script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "verify"
    path.write_text(f'#!/bin/sh\necho "checked $* ($INGERO_NODE)"\n{body}\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def controller(
    slurm: StandInSlurm, events: list[Event], clock: ManualClock, command: str | None
) -> DrainController:
    config = dataclasses.replace(
        CONFIG, resume_idle=dataclasses.replace(IDLE, command=command, timeout=2.0)
    )
    made = DrainController(
        config, slurm, events.append, clock, report=Reports({"n2": CLEAN, "n3": CLEAN})
    )
    made.start()
    return made


def ticks(made: DrainController, clock: ManualClock, *steps: float) -> None:
    for step in steps:
        clock.advance(step)
        made.on_tick(TickResult(clock.now(), (), (), (), ()))
        assert made.wait_idle(20)


@pytest.mark.parametrize(
    ("body", "passed"), [("exit 0", True), ("echo 'GPU 1: ECC errors'; exit 3", False)]
)
def test_the_site_check_decides_and_the_event_says_what_it_found(
    tmp_path: Path, body: str, passed: bool
) -> None:
    slurm, events, clock = StandInSlurm(), [], ManualClock()
    slurm.state["n2"] = drained("n2")
    made = controller(slurm, events, clock, f"{script(tmp_path, body)} --node")
    try:
        ticks(made, clock, 0, 300, 300)
    finally:
        made.stop()
    (event,) = events
    check = event.extra["verification"]
    assert check["idle_drained_by_ingero"] is True and check["gpu_clean_s"] == 600.0
    site = check["site_check"]
    assert site["command"][-2:] == ["--node", "n2"]
    assert "checked --node n2 (n2)" in site["output"]
    if passed:
        assert slurm.calls == [("resume", "n2")]
        assert event.type == "node_resumed" and site["exit"] == 0
        assert "verified: GPU health clean for 600.0s, site check exit 0" in event.extra["reason"]
        assert made.idle_outcomes == {("resumed", "verified"): 1}
    else:
        assert slurm.calls == [] and slurm.state["n2"].drained  # stays drained
        assert event.type == "drain_skipped" and event.extra["skip"] == "verify_failed"
        assert site["exit"] == 3 and "GPU 1: ECC errors" in event.extra["reason"]
        assert made.idle_outcomes == {("refused", "verify_failed"): 1}


def test_a_site_check_that_hangs_is_a_failed_one(tmp_path: Path) -> None:
    slurm, events, clock = StandInSlurm(), [], ManualClock()
    slurm.state["n2"] = drained("n2")
    made = controller(slurm, events, clock, str(script(tmp_path, "sleep 30")))
    try:
        ticks(made, clock, 0, 600)
    finally:
        made.stop()
    (event,) = events
    assert event.extra["skip"] == "verify_failed"
    assert event.extra["verification"]["site_check"]["output"] == "no answer within 2s"
    assert slurm.state["n2"].drained


def test_a_gpu_fault_event_holds_the_node_back(tmp_path: Path) -> None:
    slurm, events, clock = StandInSlurm(), [], ManualClock()
    slurm.state["n2"] = drained("n2")
    made = controller(slurm, events, clock, None)
    try:
        ticks(made, clock, 0, 500)
        made.on_events(
            [Event(type="gpu_xid", node_id="n2", cluster_id="c", timestamp=0.0, extra={})]
        )
        ticks(made, clock, 200)  # 700 s since the job ended, but the XID came at 500
        assert slurm.calls == []
        ticks(made, clock, 600)
    finally:
        made.stop()
    assert slurm.calls == [("resume", "n2")]
    assert [e.type for e in events] == ["node_resumed"]  # the next look was clean again
