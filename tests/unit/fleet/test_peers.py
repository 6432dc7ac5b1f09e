"""FleetState's peer rates, stalled nodes and one episode id shared with the node
(ManualClock-driven; the rules are docs/fleet-threshold.md's "Peer rates", "Stalled nodes"
and "One episode, one id")."""

from __future__ import annotations

import statistics

from ingero.fleet.config import FleetConfig, ThresholdConfig
from ingero.fleet.model import TickResult
from ingero.fleet.state import FleetState
from ingero.otlp.health import NodePush
from ingero.otlp.threshold import ENTER_INTERVALS, EXIT_INTERVALS
from ingero.runtime.clock import ManualClock

JOB = "42"
NODES = [f"n{i}" for i in range(8)]


def make(exit_intervals: int = EXIT_INTERVALS) -> tuple[FleetState, ManualClock]:
    """The defaults (quorum 5, the enter and exit rules), but for ``exit_intervals``."""
    clock = ManualClock()
    config = FleetConfig(threshold=ThresholdConfig(exit_intervals=exit_intervals))
    return FleetState(config, clock), clock


def push(node: str, score: float = 0.9, rate: float | None = 3484.0, **kw: object) -> NodePush:
    rates = {} if rate is None else {"kernel_launch_rate": rate}
    return NodePush(
        node_id=node,
        cluster_id="c1",
        score=score,
        job_id=JOB,
        rates=rates,
        **kw,  # type: ignore[arg-type]
    )


def interval(
    state: FleetState, clock: ManualClock, special: dict[str, NodePush] | None = None
) -> TickResult:
    """Every node pushes (healthy unless ``special`` says), then Fleet ticks."""
    for i, node in enumerate(NODES):
        state.ingest((special or {}).get(node) or push(node, 0.9 + 0.002 * i, 3484.0 + i))
    result = state.tick()
    clock.advance(5)
    return result


def types(result: TickResult) -> list[tuple[str, str]]:
    return [(e.type, e.node_id) for e in result.events]


def short_of_entry(state: FleetState, clock: ManualClock, special: dict[str, NodePush]) -> None:
    """The ticks below before the one that meets the default enter rule (ENTER_INTERVALS
    in a row): no episode yet."""
    for _ in range(ENTER_INTERVALS - 1):
        assert interval(state, clock, special).events == ()


def test_peer_medians_over_active_working_nodes_and_each_nodes_ratio_in_its_reply() -> None:
    state, clock = make()
    slow = {"n0": push("n0", 0.9, 2613.0)}  # 25% slower than its peers from birth
    interval(state, clock, slow)
    view = state.ingest(push("n0", 0.9, 2613.0))
    assert view.peer_rates is not None
    median = statistics.median([2613.0] + [3484.0 + i for i in range(1, 8)])
    assert view.peer_rates["kernel_launch_rate"] == median
    assert view.rate_ratios == {"kernel_launch_rate": 2613.0 / median}
    # The API gives the group's medians, and a named node's ratios.
    api = state.threshold_view("c1", JOB, node_id="n0")
    assert api is not None and api.rate_ratios == view.rate_ratios
    group = state.threshold_view("c1", JOB)
    assert group is not None and group.rate_ratios is None and group.peer_rates == view.peer_rates
    # A stalled node and an idle one are not peers the medians are taken over.
    interval(
        state,
        clock,
        {
            "n1": push("n1", 0.2, 0.0, stalled=True),
            "n2": push("n2", 0.9, 10.0, state="idle"),
            "n3": push("n3", 0.9, 1.0),
        },
    )
    after = state.threshold_view("c1", JOB)
    assert after is not None and after.peer_rates is not None
    working = [3484.0, 1.0] + [3484.0 + i for i in range(4, 8)]  # n0, n3, n4..n7
    assert after.peer_rates["kernel_launch_rate"] == statistics.median(working)


def test_no_peer_median_without_a_quorum_of_nodes_that_pushed_the_rate() -> None:
    state, clock = make()
    interval(state, clock, {n: push(n, 0.9, None) for n in NODES[:4]})  # 4 pushed it, quorum 5
    view = state.ingest(push("n0"))
    assert view.quorum_met and view.peer_rates is None and view.rate_ratios is None


def test_a_stalled_node_stays_in_the_statistics_and_is_a_straggler_with_reason_stall() -> None:
    state, clock = make()
    interval(state, clock)
    stalled = {"n3": push("n3", 0.1, 0.0, stalled=True, episode_id=None)}
    for _ in range(ENTER_INTERVALS - 1):
        first = interval(state, clock, stalled)
        assert first.events == ()  # fewer ticks below than the enter rule wants
        assert first.groups[0].active_nodes == 8  # counted, not left out as idle would be
    second = interval(state, clock, stalled)
    (event,) = second.events
    assert (event.type, event.node_id, event.extra["reason"]) == ("straggler_state", "n3", "stall")
    assert [v.node_id for v in second.verdicts] == ["n3"]  # drained like any straggler
    # It never recovers by going quiet: while stalled and active it stays a straggler.
    for _ in range(5):
        assert interval(state, clock, stalled).events == ()
    # Its job ends first (processes gone: the node goes idle): job_ended, not recovered.
    ended = interval(state, clock, {"n3": push("n3", 0.9, None, state="idle")})
    (resolved,) = ended.events
    assert resolved.type == "straggler_resolved" and resolved.event_id == event.event_id
    assert resolved.extra["reason"] == "job_ended"


def test_a_straggler_whose_job_left_the_node_ends_as_job_ended() -> None:
    state, clock = make()
    interval(state, clock)
    slow = {"n5": push("n5", 0.6, 2000.0)}
    short_of_entry(state, clock, slow)
    assert types(interval(state, clock, slow)) == [("straggler_state", "n5")]
    gone = NodePush(node_id="n5", cluster_id="c1", score=0.9, state="idle")  # no job file
    (resolved,) = interval(state, clock, {"n5": gone}).events
    assert resolved.extra["reason"] == "job_ended"


def test_a_job_that_ends_on_every_node_raises_nothing() -> None:
    state, clock = make()
    for _ in range(3):
        assert interval(state, clock).events == ()
    idle = {n: NodePush(node_id=n, cluster_id="c1", score=0.9, state="idle") for n in NODES}
    for _ in range(3):
        assert interval(state, clock, idle).events == ()


def test_the_node_saw_it_first_fleet_adopts_its_id() -> None:
    state, clock = make()
    interval(state, clock)
    short_of_entry(state, clock, {"n2": push("n2", 0.5, episode_id="")})
    # The node opened its episode after its last push; this push carries its id.
    result = interval(state, clock, {"n2": push("n2", 0.5, episode_id="node-id-1")})
    (event,) = result.events
    assert event.type == "straggler_state" and event.event_id == "node-id-1"
    assert result.verdicts[0].event_id == "node-id-1"


def offered_episode(state: FleetState, clock: ManualClock) -> TickResult:
    """n2 below until Fleet's enter rule is met while the node said "none open": Fleet's id
    is offered in replies (the tick's verdict), not announced."""
    interval(state, clock)
    below = {"n2": push("n2", 0.5, episode_id="")}
    short_of_entry(state, clock, below)
    entered = interval(state, clock, below)
    assert entered.events == ()
    return entered


def test_fleet_saw_it_first_its_id_is_offered_and_announced_after_one_push() -> None:
    state, clock = make()
    # Fleet's enter rule is met, but the node (which reports episodes) may be opening its
    # own right now: Fleet's id is offered in the reply, not announced yet.
    entered = offered_episode(state, clock)
    offered = state.ingest(push("n2", 0.5, episode_id=""))
    assert offered.episode_id == entered.verdicts[0].event_id
    # That push said "none open": Fleet announces its id, which the node adopts on entry.
    (event,) = state.tick().events
    assert event.type == "straggler_state" and event.event_id == offered.episode_id


def test_both_at_once_fleets_offered_id_gives_way_to_the_nodes() -> None:
    state, clock = make()
    offered_episode(state, clock)
    # Meanwhile the node opened its own (its reply came before Fleet's tick).
    result = interval(state, clock, {"n2": push("n2", 0.5, episode_id="node-id-2")})
    (event,) = result.events
    assert event.event_id == "node-id-2" and result.verdicts[0].event_id == "node-id-2"
    assert state.ingest(push("n2", 0.5, episode_id="node-id-2")).episode_id == "node-id-2"


def test_an_agent_that_reports_no_episodes_is_announced_at_once() -> None:
    state, clock = make()
    interval(state, clock)
    older = {"n2": push("n2", 0.5)}  # no ingero.episode.id attribute at all
    short_of_entry(state, clock, older)
    assert types(interval(state, clock, older)) == [("straggler_state", "n2")]


def test_an_offered_episode_that_ends_before_it_is_announced_says_nothing() -> None:
    state, clock = make(exit_intervals=1)  # an episode that can end at its next measurement
    offered_episode(state, clock)
    state.ingest(push("n2", 0.99, episode_id=""))  # recovered at once
    assert state.tick().events == ()


def test_an_offered_episode_the_node_took_ends_on_both_sides() -> None:
    state, clock = make(exit_intervals=1)
    offered_episode(state, clock)
    offered = state.ingest(push("n2", 0.5, episode_id=""))
    # The node entered with the offered id (its straggler_state is out) and recovered by its
    # next push, before Fleet's next tick: Fleet must still tell that episode, start and end.
    state.ingest(push("n2", 0.99, episode_id=offered.episode_id))
    result = state.tick()
    assert types(result) == [("straggler_state", "n2"), ("straggler_resolved", "n2")]
    assert {e.event_id for e in result.events} == {offered.episode_id}
    assert result.events[1].extra["reason"] == "recovered"
    assert result.verdicts == ()
