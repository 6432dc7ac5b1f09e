"""The drain controller's threading: ticks never wait on Slurm, coalesce while it is slow,
failed calls are retried with backoff, and every decision becomes an event.

Slurm is replaced by a stand-in (Slurm is an external program; the real one is exercised
in tests/integration/slurm)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from ingero.fleet.model import NodeVerdict, TickResult
from ingero.runtime.clock import ManualClock
from ingero.schema.events import Event
from ingero.slurm.backend import NodeInfo, SlurmError
from ingero.slurm.drain import DrainController
from ingero.slurm.drain_policy import DrainConfig

CONFIG = DrainConfig(enabled=True, max_fraction=0.5, min_intervals=1, cooldown=0)


@dataclass
class StandInSlurm:
    """Nodes n1..n4; ``gate`` blocks nodes() until set; ``fail`` makes the next calls fail."""

    name: str = "stand-in"

    def __post_init__(self) -> None:
        self.state = {f"n{i}": NodeInfo(f"n{i}", "idle") for i in range(1, 5)}
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail = 0
        self.reads = 0
        self.calls: list[tuple[str, str]] = []
        self.before_read: Callable[[int], None] | None = None

    def nodes(self) -> list[NodeInfo]:
        if self.before_read is not None:
            self.before_read(self.reads)
        self.entered.set()
        assert self.gate.wait(30)
        self.reads += 1
        if self.fail:
            self.fail -= 1
            raise SlurmError("sinfo --json: no answer within 10s")
        return list(self.state.values())

    def cluster_name(self) -> str:
        return "c"

    def drain(self, node: str, reason: str) -> None:
        self.calls.append(("drain", node))
        self.state[node] = NodeInfo(node, "idle", frozenset({"DRAIN"}), reason)

    def resume(self, node: str) -> None:
        self.calls.append(("resume", node))
        self.state[node] = NodeInfo(node, "idle")


def verdict(
    node: str, score: float = 0.3, panic: bool = False, ticks: int = 3, cluster: str = "c"
) -> NodeVerdict:
    return NodeVerdict(
        node, cluster, f"{cluster}/job/1", "1", 0, score, 0.8, True, ticks, 1e9, panic, True, None
    )


def tick(*verdicts: NodeVerdict, events: tuple[Event, ...] = ()) -> TickResult:
    return TickResult(0.0, (), verdicts, events, ())


def resolved(node: str, reason: str, panic: bool = False, cluster: str = "c") -> Event:
    """Fleet's event for a straggler episode that ended this tick."""
    extra = {"reason": reason, "panic": panic, "group": f"{cluster}/job/1"}
    return Event(
        type="straggler_resolved", node_id=node, cluster_id=cluster, timestamp=1e9, extra=extra
    )


@pytest.fixture
def slurm() -> StandInSlurm:
    return StandInSlurm()


def make(slurm: StandInSlurm, events: list[Event], config: DrainConfig = CONFIG) -> DrainController:
    controller = DrainController(
        config, slurm, events.append, ManualClock(), backoff_initial=0.01, backoff_max=0.02
    )
    controller.start()
    return controller


def test_drain_emits_node_drained(slurm: StandInSlurm) -> None:
    events: list[Event] = []
    controller = make(slurm, events)
    try:
        controller.on_tick(tick(verdict("n2")))
        assert controller.wait_idle(10)
    finally:
        controller.stop()
    assert slurm.calls == [("drain", "n2")]
    (event,) = events
    assert (event.type, event.node_id, event.job_id, event.score) == (
        "node_drained",
        "n2",
        "1",
        0.3,
    )
    assert event.extra["reason"].startswith("ingero: straggler score=0.30 threshold=0.80 job=1")
    assert event.extra["backend"] == "stand-in"


def test_ticks_do_not_wait_for_slurm_and_coalesce(slurm: StandInSlurm) -> None:
    events: list[Event] = []
    controller = make(slurm, events)
    try:
        slurm.gate.clear()
        controller.on_tick(tick(verdict("n4", panic=True)))
        assert slurm.entered.wait(10)  # the worker is now stuck inside Slurm
        for i in range(100):  # returns every time, though Slurm answers nothing
            controller.on_tick(tick(verdict("n3")) if i == 99 else tick())
        assert not controller.wait_idle(0.05)
        slurm.gate.set()
        assert controller.wait_idle(10)
    finally:
        controller.stop()
    assert slurm.reads == 3  # the stuck tick, the newest of the 100, its re-read to drain
    assert slurm.calls == [("drain", "n3")]


def test_failures_are_retried_with_backoff(
    slurm: StandInSlurm, caplog: pytest.LogCaptureFixture
) -> None:
    events: list[Event] = []
    slurm.fail = 3
    controller = make(slurm, events)
    try:
        controller.on_tick(tick(verdict("n2")))
        assert controller.wait_idle(10)
    finally:
        controller.stop()
    assert controller.failures == 3 and slurm.reads == 5  # + 1 good read + 1 re-read
    assert slurm.calls == [("drain", "n2")]
    assert "no answer within 10s; retrying in" in caplog.text


def test_an_event_sink_that_raises_does_not_stop_the_worker(slurm: StandInSlurm) -> None:
    def broken(event: Event) -> None:
        raise RuntimeError("sink down")

    controller = DrainController(CONFIG, slurm, broken, ManualClock())
    controller.start()
    try:
        controller.on_tick(tick(verdict("n2")))
        assert controller.wait_idle(10)
        controller.on_tick(tick(verdict("n3")))
        assert controller.wait_idle(10)
    finally:
        controller.stop()
    assert slurm.calls == [("drain", "n2"), ("drain", "n3")]


def test_skips_are_events_too(slurm: StandInSlurm) -> None:
    events: list[Event] = []
    controller = make(slurm, events)
    try:
        controller.on_tick(tick(verdict("n2", panic=True)))
        assert controller.wait_idle(10)
    finally:
        controller.stop()
    (event,) = events
    assert (event.type, event.extra["skip"]) == ("drain_skipped", "panic")
    assert slurm.calls == []


def test_stop_while_backing_off(slurm: StandInSlurm) -> None:
    slurm.fail = 1000
    controller = DrainController(CONFIG, slurm, lambda e: None, ManualClock(), backoff_initial=60)
    controller.start()
    assert controller.running
    controller.on_tick(tick(verdict("n2")))
    assert slurm.entered.wait(10)
    controller.stop(timeout=10)  # does not sit out the 60s backoff
    assert not controller.running


def test_a_reason_set_between_read_and_drain_is_not_overwritten(slurm: StandInSlurm) -> None:
    def admin_acts(reads: int) -> None:
        if reads == 1:  # after ingero's first read, before its drain
            slurm.state["n2"] = NodeInfo("n2", "idle", frozenset({"DRAIN"}), "admin: fan")

    slurm.before_read = admin_acts
    events: list[Event] = []
    controller = make(slurm, events)
    try:
        controller.on_tick(tick(verdict("n2")))
        assert controller.wait_idle(10)
    finally:
        controller.stop()
    assert slurm.calls == [] and slurm.state["n2"].reason == "admin: fan"
    (event,) = events
    assert (event.type, event.extra["skip"]) == ("drain_skipped", "foreign_reason")
    assert "admin: fan" in event.extra["reason"]


def test_slurm_is_not_asked_while_no_node_is_ready(slurm: StandInSlurm) -> None:
    events: list[Event] = []
    controller = make(slurm, events, dataclasses.replace(CONFIG, min_intervals=5))
    try:
        for _ in range(3):
            controller.on_tick(tick())
            controller.on_tick(tick(verdict("n2", ticks=4)))
            assert controller.wait_idle(10)
        assert slurm.reads == 0
        controller.on_tick(tick(verdict("n2", ticks=5)))
        assert controller.wait_idle(10)
    finally:
        controller.stop()
    assert slurm.reads == 2 and slurm.calls == [("drain", "n2")]


def test_verdicts_of_another_cluster_are_not_this_slurms_business(slurm: StandInSlurm) -> None:
    events: list[Event] = []
    controller = make(slurm, events)
    try:
        controller.on_tick(tick(verdict("n2", cluster="other")))
        assert controller.wait_idle(10)
    finally:
        controller.stop()
    assert slurm.calls == [] and events == []


AUTO = dataclasses.replace(CONFIG, auto_resume=True, min_intervals=2)


def drained_by_ingero(slurm: StandInSlurm, node: str = "n2") -> None:
    slurm.state[node] = NodeInfo(node, "idle", frozenset({"DRAIN"}), "ingero: straggler x")


def handle(controller: DrainController, *ticks: TickResult) -> None:
    for t in ticks:
        controller.on_tick(t)
        assert controller.wait_idle(10)


def test_auto_resume_after_a_recovered_episode(slurm: StandInSlurm) -> None:
    drained_by_ingero(slurm)
    events: list[Event] = []
    controller = make(slurm, events, AUTO)
    try:
        handle(controller, tick(), tick(), tick(events=(resolved("n2", "recovered"),)))
        assert slurm.calls == []  # the recovery tick is the first of min_intervals
        handle(controller, tick())
    finally:
        controller.stop()
    assert slurm.calls == [("resume", "n2")]
    assert [(e.type, e.node_id) for e in events] == [("node_resumed", "n2")]


def test_another_clusters_node_of_the_same_name_does_not_cancel_a_recovery(
    slurm: StandInSlurm,
) -> None:
    """A node id names a node only within its cluster: cluster other's n2 ending badly, or
    expiring, says nothing about this cluster's recovered n2."""
    drained_by_ingero(slurm)
    controller = make(slurm, [], AUTO)
    other = (resolved("n2", "inactive", cluster="other"),)
    try:
        handle(controller, tick(), tick(), tick(events=(resolved("n2", "recovered"),)))
        gone = TickResult(0.0, (), (), other, (("other", "n2"),))
        handle(controller, gone)
    finally:
        controller.stop()
    assert slurm.calls == [("resume", "n2")]


def test_its_own_node_expiring_cancels_a_recovery(slurm: StandInSlurm) -> None:
    drained_by_ingero(slurm)
    controller = make(slurm, [], AUTO)
    try:
        handle(controller, tick(), tick(), tick(events=(resolved("n2", "recovered"),)))
        handle(controller, TickResult(0.0, (), (), (), (("c", "n2"),)), tick(), tick())
    finally:
        controller.stop()
    assert slurm.calls == []


@pytest.mark.parametrize(
    "ending",
    [
        resolved("n2", "inactive"),  # its job ended: the usual fate of a drained node
        resolved("n2", "group_changed"),
        resolved("n2", "quorum_lost"),
        resolved("n2", "expired"),
        resolved("n2", "recovered", panic=True),
        resolved("n2", "recovered", cluster="other"),
    ],
    ids=["inactive", "group_changed", "quorum_lost", "expired", "panic", "other_cluster"],
)
def test_no_auto_resume_without_evidence_of_recovery(slurm: StandInSlurm, ending: Event) -> None:
    drained_by_ingero(slurm)
    controller = make(slurm, [], AUTO)
    try:
        handle(controller, tick(events=(ending,)), *[tick() for _ in range(5)])
    finally:
        controller.stop()
    assert slurm.calls == []


def coalesce(slurm: StandInSlurm, controller: DrainController, *ticks: TickResult) -> None:
    """Hand in ``ticks`` while the worker is stuck in Slurm, so they are coalesced."""
    slurm.gate.clear()
    slurm.entered.clear()
    controller.on_tick(tick())
    assert slurm.entered.wait(10)
    for t in ticks:
        controller.on_tick(t)
    slurm.gate.set()
    assert controller.wait_idle(10)


def test_coalesced_ticks_keep_their_recoveries(slurm: StandInSlurm) -> None:
    drained_by_ingero(slurm)
    controller = make(slurm, [], AUTO)
    try:
        coalesce(slurm, controller, tick(events=(resolved("n2", "recovered"),)), tick(), tick())
        assert slurm.calls == [] and slurm.reads == 2  # the stuck tick and the newest one
        handle(controller, tick())
    finally:
        controller.stop()
    assert slurm.calls == [("resume", "n2")]


def test_a_later_ending_in_coalesced_ticks_cancels_the_recovery(slurm: StandInSlurm) -> None:
    drained_by_ingero(slurm)
    controller = make(slurm, [], AUTO)
    try:
        coalesce(
            slurm,
            controller,
            tick(events=(resolved("n2", "recovered"),)),
            tick(verdict("n2")),  # straggling again, then its job ends
            tick(events=(resolved("n2", "inactive"),)),
        )
        handle(controller, *[tick() for _ in range(5)])
    finally:
        controller.stop()
    assert slurm.calls == []


def test_a_failed_tick_keeps_its_recoveries_for_the_retry(slurm: StandInSlurm) -> None:
    drained_by_ingero(slurm)
    slurm.fail = 2
    controller = make(slurm, [], AUTO)
    try:
        handle(controller, tick(events=(resolved("n2", "recovered"),)))
        assert controller.failures == 2 and slurm.calls == []
        handle(controller, tick())
    finally:
        controller.stop()
    assert slurm.calls == [("resume", "n2")]
