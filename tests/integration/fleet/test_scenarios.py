"""Straggler scenarios against a real FleetDaemon (real listeners, real ticks) in-process.

In-process so the test can hook the tick listener and the event sink, the extension points
the drain controller and Echo forwarding use.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import pytest

from ingero.fleet.config import FleetConfig, ListenConfig, ThresholdConfig
from ingero.fleet.daemon import FleetDaemon
from ingero.fleet.model import TickResult
from ingero.otlp.health import NodePush
from ingero.otlp.threshold import ENTER_INTERVALS
from ingero.runtime.config import Duration
from ingero.schema.events import Event
from tests.integration.fleet.helpers import Fleet, expected_threshold, wait_for

pytestmark = pytest.mark.integration


class Running:
    def __init__(self, ttl_multiplier: float = 1000) -> None:
        config = FleetConfig(
            listen=ListenConfig("127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"),
            push_interval=Duration(0.2),
            ttl_multiplier=ttl_multiplier,
            threshold=ThresholdConfig(ema_alpha=1.0),
        )
        self.daemon = FleetDaemon(config)
        self.events: list[Event] = []
        self.ticks: list[TickResult] = []
        self._lock = threading.Lock()
        self.daemon.add_event_sink(self._sink)
        self.daemon.add_tick_listener(self._listener)
        bound = self.daemon.start()
        self.client = Fleet(None, bound.otlp_grpc, bound.otlp_http, bound.api)

    def _sink(self, events: Sequence[Event]) -> None:
        with self._lock:
            self.events.extend(events)

    def _listener(self, result: TickResult) -> None:
        with self._lock:
            self.ticks.append(result)

    def events_of(self, kind: str) -> list[Event]:
        with self._lock:
            return [e for e in self.events if e.type == kind]

    def tick_after(self, pushes: Sequence[NodePush]) -> TickResult:
        """Push, then wait for a tick that started after the push was acknowledged, and for
        as many ticks as the default enter rule needs to start an episode (ENTER_INTERVALS
        below in a row: each tick judges the node's last push again)."""
        assert self.client.push(pushes).status == 200
        with self._lock:
            seen = len(self.ticks)
        ticks = max(2, ENTER_INTERVALS)
        wait_for(lambda: len(self.ticks) >= seen + ticks, what=f"{ticks} ticks")
        with self._lock:
            return self.ticks[-1]


@pytest.fixture
def fleet() -> Iterator[Running]:
    running = Running()
    try:
        yield running
    finally:
        running.daemon.stop()


def group(scores: Sequence[float], job: str = "1", cluster: str = "hpc") -> list[NodePush]:
    return [
        NodePush(node_id=f"{cluster}-{job}-{i}", cluster_id=cluster, score=s, job_id=job, rank=i)
        for i, s in enumerate(scores)
    ]


HEALTHY = [0.90, 0.91, 0.89, 0.92, 0.90, 0.88, 0.91, 0.90]


def test_one_straggler_among_eight(fleet: Running) -> None:
    scores = [*HEALTHY[:7], 0.40]
    result = fleet.tick_after(group(scores))
    assert [v.node_id for v in result.verdicts] == ["hpc-1-7"]
    (stats,) = result.groups
    assert stats.threshold == pytest.approx(expected_threshold(scores), abs=1e-12)
    assert not stats.panic and stats.straggler_count == 1
    (event,) = fleet.events_of("straggler_state")
    assert event.node_id == "hpc-1-7" and event.rank == 7 and event.extra["panic"] is False
    reply = fleet.client.push(group(scores)[:1])
    assert float(reply.headers["x-ingero-threshold"]) == pytest.approx(stats.threshold)
    assert reply.headers["x-ingero-panic"] == "false"


def test_two_stragglers_among_eight(fleet: Running) -> None:
    result = fleet.tick_after(group([*HEALTHY[:6], 0.40, 0.45]))
    assert sorted(v.node_id for v in result.verdicts) == ["hpc-1-6", "hpc-1-7"]
    assert not result.groups[0].panic
    assert fleet.events_of("group_degraded") == []


def test_forty_percent_slow_is_panic(fleet: Running) -> None:
    pushes = group([0.90, 0.91, 0.89, 0.92, 0.90, 0.88, 0.40, 0.42, 0.41, 0.43])
    result = fleet.tick_after(pushes)
    assert result.groups[0].panic
    assert len(result.verdicts) == 4 and all(v.panic for v in result.verdicts)
    reply = fleet.client.push(pushes[:1])
    assert reply.headers["x-ingero-panic"] == "true"
    fleet.tick_after(pushes)  # a later tick in the same episode does not repeat the event
    assert len(fleet.events_of("group_degraded")) == 1
    stragglers = fleet.events_of("straggler_state")
    assert len(stragglers) == 4 and all(e.extra["panic"] is True for e in stragglers)
    assert fleet.client.metric("ingero_fleet_panic_mode", group="hpc/job/1") == 1


def test_idle_node_leaves_the_statistics(fleet: Running) -> None:
    pushes = group(HEALTHY[:6])
    fleet.tick_after(pushes)
    idle = NodePush(node_id="hpc-1-9", cluster_id="hpc", score=0.05, job_id="1", state="idle")
    result = fleet.tick_after([idle])
    (stats,) = result.groups
    assert stats.active_nodes == 6 and stats.idle_nodes == 1
    assert stats.threshold == pytest.approx(expected_threshold(HEALTHY[:6]), abs=1e-12)
    assert result.verdicts == ()  # its low score is not judged while idle
    assert fleet.client.metric("ingero_fleet_idle_nodes", group="hpc/job/1") == 1


def test_two_jobs_in_one_cluster_have_separate_thresholds(fleet: Running) -> None:
    fast = [0.95, 0.94, 0.96, 0.95, 0.93]
    slow = [0.60, 0.62, 0.58, 0.61, 0.59, 0.60]
    fleet.tick_after(group(fast, job="10") + group(slow, job="20"))
    views = {job: fleet.client.threshold("hpc", job).json() for job in ("10", "20")}
    assert views["10"]["threshold"] == pytest.approx(expected_threshold(fast), abs=1e-12)
    assert views["20"]["threshold"] == pytest.approx(expected_threshold(slow), abs=1e-12)
    assert (views["10"]["active_nodes"], views["20"]["active_nodes"]) == (5, 6)
    assert fleet.client.metric("ingero_fleet_stragglers") == 0  # slow job is not slow


def test_fewer_nodes_than_quorum(fleet: Running) -> None:
    pushes = group([0.9, 0.9, 0.3, 0.9])
    result = fleet.tick_after(pushes)
    assert result.verdicts == ()
    view = fleet.client.threshold("hpc", "1").json()
    assert view["quorum_met"] is False and view["threshold"] is None
    reply = fleet.client.push(pushes[:1])
    assert reply.headers["x-ingero-threshold"] == ""
    assert reply.headers["x-ingero-quorum-met"] == "false"


def test_silent_node_expires() -> None:
    # Nodes expire 5 s after their last push: longer than a loaded host takes to tick
    # twice after a push (at 0.4 s every node had expired before the first count).
    running = Running(ttl_multiplier=25)
    try:
        talkers = group(HEALTHY[:6])
        silent = NodePush(node_id="quiet", cluster_id="hpc", score=0.9, job_id="1")
        running.tick_after([*talkers, silent])
        assert running.daemon.state.node_count() == 7

        def only_talkers_left() -> bool:
            running.client.push(talkers)  # the others keep pushing
            return running.daemon.state.node_count() == 6

        wait_for(only_talkers_left, what="the silent node to expire")
        view = wait_for(
            lambda: (v := running.client.threshold("hpc", "1").json())["active_nodes"] == 6 and v,
            what="the view without the silent node",
        )
        assert view["quorum_met"]
    finally:
        running.daemon.stop()


def test_failing_tick_listener_is_counted_not_fatal(fleet: Running) -> None:
    def broken(_result: TickResult) -> None:
        raise RuntimeError("listener bug")

    fleet.daemon.add_tick_listener(broken)
    fleet.tick_after(group(HEALTHY))
    assert fleet.client.metric("ingero_fleet_tick_listener_errors_total", listener="broken") >= 1
    fleet.tick_after(group(HEALTHY))  # ticks go on
    assert fleet.daemon.ready()


class RecordingNotifier:
    """Stands in for systemd's notify socket (sdnotify's API), recording every message."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self._lock = threading.Lock()

    def notify(self, state: str) -> None:
        with self._lock:
            self.messages.extend(state.split("\n"))

    def count(self, prefix: str) -> int:
        with self._lock:
            return sum(m.startswith(prefix) for m in self.messages)


def test_watchdog_pings_stop_while_ticks_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "200000")  # ping every 0.1 s
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    notifier = RecordingNotifier()
    config = FleetConfig(
        listen=ListenConfig("127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"),
        push_interval=Duration(0.1),
    )
    daemon = FleetDaemon(config, notifier=notifier)  # type: ignore[arg-type]
    daemon.start()
    try:
        wait_for(lambda: notifier.count("WATCHDOG=1") >= 3, what="watchdog pings")
        assert notifier.count("READY=1") == 1

        def broken_tick() -> TickResult:
            raise RuntimeError("tick bug")

        monkeypatch.setattr(daemon.state, "tick", broken_tick)
        registry = daemon.metrics.registry

        def failures() -> float:
            return registry.get_sample_value("ingero_fleet_tick_failures_total") or 0.0

        # Pings stop 2 intervals + 1 watchdog period (0.3 s) after the last good tick; six
        # failed ticks are at least 0.5 s.
        wait_for(lambda: failures() >= 6, what="six failed ticks")
        pings = notifier.count("WATCHDOG=1")
        wait_for(lambda: failures() >= 12, what="six more failed ticks")
        assert notifier.count("WATCHDOG=1") == pings
        assert not daemon.ready()  # /readyz says 503 too
        monkeypatch.undo()
        wait_for(lambda: notifier.count("WATCHDOG=1") > pings, what="pings after recovery")
    finally:
        daemon.stop()
    assert notifier.count("STOPPING=1") == 1
