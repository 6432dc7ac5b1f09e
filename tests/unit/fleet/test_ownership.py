"""The replica ownership rule for drains (ingero.fleet.ownership), table-driven, and the
same rule as FleetState applies it (a fake clock, real ticks)."""

from __future__ import annotations

import pytest

from ingero.fleet.config import FleetConfig, ThresholdConfig
from ingero.fleet.ownership import Ownership, owns
from ingero.fleet.state import FleetState
from ingero.otlp.health import NodePush
from ingero.runtime.clock import ManualClock
from ingero.slurm.drain_policy import DrainConfig

INTERVAL = 5.0
MIN = 3


@pytest.mark.parametrize(
    ("now", "last_push", "quorum_ticks", "expected", "why"),
    [
        (100.0, 99.0, 3, True, "fresh pushes, quorum for min_intervals ticks"),
        (100.0, 90.0, 3, True, "last push exactly two intervals ago"),
        (100.0, 89.9, 3, False, "no push for more than two intervals: moved away"),
        (100.0, 99.0, 2, False, "takeover window: quorum for fewer ticks"),
        (100.0, 99.0, 0, False, "just taken over"),
        (100.0, None, 10, False, "never pushed here"),
    ],
)
def test_owns(
    now: float, last_push: float | None, quorum_ticks: int, expected: bool, why: str
) -> None:
    assert owns(now, last_push, quorum_ticks, INTERVAL, MIN) is expected, why


def run_ticks(
    own: Ownership, script: list[tuple[float, list[str], list[tuple[str, bool]]]]
) -> list[bool]:
    """Per step: pushes of the named clusters at ``t``, then a tick with the groups
    (cluster, quorum) at ``t``; the owner() answer for cluster "a" group "a/j" after it."""
    out = []
    for t, pushed, groups in script:
        for cluster in pushed:
            own.pushed(cluster, t)
        own.tick(t, [(c, f"{c}/j", q) for c, q in groups])
        out.append(own.owner("a", "a/j", t))
    return out


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        # steady: owned from the third tick with quorum after the takeover
        (
            [(5.0 * i, ["a"], [("a", True)]) for i in range(1, 6)],
            [False, False, True, True, True],
        ),
        # quorum lost at tick 3: the count starts again
        (
            [
                (5.0, ["a"], [("a", True)]),
                (10.0, ["a"], [("a", True)]),
                (15.0, ["a"], [("a", False)]),
                (20.0, ["a"], [("a", True)]),
                (25.0, ["a"], [("a", True)]),
                (30.0, ["a"], [("a", True)]),
            ],
            [False, False, False, False, False, True],
        ),
        # the cluster moves away after tick 4: its nodes are still tracked (stale) but
        # ownership ends once no push came for two intervals
        (
            [(5.0 * i, ["a"], [("a", True)]) for i in range(1, 5)]
            + [(5.0 * i, [], [("a", True)]) for i in range(5, 8)],
            [False, False, True, True, True, True, False],
        ),
        # back after longer than the TTL (30 s): a takeover, the window starts again
        (
            [
                (5.0, ["a"], [("a", True)]),
                (10.0, ["a"], [("a", True)]),
                (15.0, ["a"], [("a", True)]),
                (50.0, ["a"], [("a", True)]),
                (55.0, ["a"], [("a", True)]),
                (60.0, ["a"], [("a", True)]),
            ],
            [False, False, True, False, False, True],
        ),
    ],
)
def test_ownership_over_ticks(
    script: list[tuple[float, list[str], list[tuple[str, bool]]]], expected: list[bool]
) -> None:
    assert run_ticks(Ownership(INTERVAL, 30.0, MIN), script) == expected


def test_takeovers_are_reported_once_and_memory_is_bounded() -> None:
    own = Ownership(INTERVAL, 30.0, MIN)
    assert own.pushed("a", 1.0) and not own.pushed("a", 2.0)
    assert own.pushed("b", 2.0)
    assert own.tick(5.0, [("a", "a/j", True)]) == ["a", "b"]
    assert own.tick(10.0, []) == []
    assert own.owned(10.0) == 2
    own.tick(100.0, [])  # both silent for longer than the TTL: forgotten
    assert own.owned(100.0) == 0
    assert own.pushed("a", 101.0)  # and a takeover again


def push(node: str, score: float, cluster: str = "a") -> NodePush:
    return NodePush(node_id=node, cluster_id=cluster, score=score, state="active", job_id="j")


def test_fleet_state_marks_verdicts_of_a_cluster_it_does_not_own() -> None:
    clock = ManualClock()
    config = FleetConfig(
        push_interval=INTERVAL,  # type: ignore[arg-type]
        drain=DrainConfig(min_intervals=MIN),
        # Two ticks below enter, so that a verdict exists before ownership does.
        threshold=ThresholdConfig(enter_intervals=2),
    )
    state = FleetState(config, clock)
    owners = []
    for i in range(8):
        clock.advance(INTERVAL)
        if i < 5:  # the cluster's pushes come here for five intervals, then move away
            for n in range(6):
                state.ingest(push(f"n{n}", 0.2 if n == 0 else 0.9))
        result = state.tick()
        straggler = [v for v in result.verdicts if v.node_id == "n0"]
        owners.append(straggler[0].drain_owner if straggler else None)
        if i == 0:
            assert result.taken_over == ("a",)
    # straggler from tick 1 (enter_intervals 2); owned from the third tick with quorum;
    # still owned two intervals after the last push (tick 7), not after that (tick 8).
    assert owners == [None, False, True, True, True, True, True, False]
