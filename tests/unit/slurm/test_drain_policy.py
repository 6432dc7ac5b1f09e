"""The drain policy's rules, one by one, on plain values."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from ingero.slurm.backend import NodeInfo
from ingero.slurm.drain_policy import (
    Decision,
    DrainConfig,
    DrainMemory,
    decide,
    drain_reason,
    max_drained,
)

SINCE = 1_795_000_000.0  # 2026-11-18T11:06:40Z


@dataclass(frozen=True)
class Lag:
    comm_hash: str = "0123456789abcdef"
    comm_rank: int = 3
    lag_s: float = 0.19997


@dataclass(frozen=True)
class V:
    node_id: str
    score: float = 0.41
    threshold: float = 0.87
    consecutive_straggler_ticks: int = 6
    straggler: bool = True
    cluster_id: str = "lab"
    job_id: str | None = "1234"
    rank: int | None = 2
    since: float = SINCE
    panic: bool = False
    quorum_met: bool = True
    drain_owner: bool = True
    reason: str = "score"
    peer_lag: Lag | None = None
    cause_class: str = "hardware"


def idle(name: str, **kw: object) -> NodeInfo:
    return NodeInfo(name=name, state=str(kw.pop("state", "idle")), **kw)  # type: ignore[arg-type]


NODES = [idle(f"n{i}") for i in range(1, 11)]  # 10 nodes: max_fraction 0.1 -> one drain
ON = DrainConfig(enabled=True)


def run(
    verdicts: list[V],
    nodes: list[NodeInfo] = NODES,
    config: DrainConfig = ON,
    memory: DrainMemory | None = None,
    now: float = 10_000.0,
    expired: list[str] | None = None,
    recovered: list[str] | None = None,
) -> list[Decision]:
    return decide(
        verdicts, nodes, config, memory or DrainMemory(), now, expired or [], recovered or []
    )


def test_off_by_default_decides_nothing() -> None:
    assert run([V("n3")], config=DrainConfig()) == []


def test_drains_a_persistent_straggler_with_the_documented_reason() -> None:
    (d,) = run([V("n3")])
    assert d.action == "drain" and d.node == "n3" and d.job_id == "1234"
    assert d.reason == (
        "ingero: straggler score=0.41 threshold=0.87 job=1234 since=2026-11-18T11:06:40Z"
        " class=hardware"
    )
    assert d.reason == drain_reason(V("n3"))


@pytest.mark.parametrize(
    ("verdict", "reason"),
    [
        # A score straggler keeps its score in the reason.
        (
            V("n3"),
            "ingero: straggler score=0.41 threshold=0.87 job=1234 since=2026-11-18T11:06:40Z"
            " class=hardware",
        ),
        # Peer lag alone: the score is above the threshold, so the reason names the rank.
        (
            V("n3", score=0.95, reason="peer_lag", peer_lag=Lag(), job_id="77"),
            "ingero: peer_lag rank 3 of comm 0123456789abcdef 200 ms late (job 77) class=hardware",
        ),
        (
            V("n3", score=0.95, reason="peer_lag", peer_lag=Lag("fedcba9876543210", 0, 1.5)),
            "ingero: peer_lag rank 0 of comm fedcba9876543210 1500 ms late (job 1234) class=hardware",
        ),
        (
            V("n3", reason="peer_lag", peer_lag=Lag(lag_s=0.0004), job_id=None),
            "ingero: peer_lag rank 3 of comm 0123456789abcdef 0 ms late (job none) class=hardware",
        ),
        # A peer_lag verdict that lost its rank (cannot happen in Fleet): the score format.
        (
            V("n3", reason="peer_lag"),
            "ingero: straggler score=0.41 threshold=0.87 job=1234 since=2026-11-18T11:06:40Z"
            " class=hardware",
        ),
    ],
)
def test_drain_reason_says_why(verdict: V, reason: str) -> None:
    (d,) = run([verdict])
    assert d.action == "drain" and d.reason == reason
    # Ingero recognises its own drain by the reason, whatever the cause.
    held = idle("n3", flags=frozenset({"DRAIN"}), reason=d.reason)
    assert held.ingero_reason
    assert run([verdict], [held, *NODES[3:]]) == []


def test_reason_without_job() -> None:
    assert " job=none " in drain_reason(V("n3", job_id=None))


def test_needs_min_intervals_consecutive_ticks() -> None:
    assert run([V("n3", consecutive_straggler_ticks=5)]) == []
    assert [d.action for d in run([V("n3", consecutive_straggler_ticks=6)])] == ["drain"]


def test_non_stragglers_are_ignored() -> None:
    assert run([V("n3", straggler=False)]) == []


@pytest.mark.parametrize(
    ("verdict", "nodes", "code"),
    [
        (V("n3", panic=True), NODES, "panic"),
        (V("n3", drain_owner=False), NODES, "not_owner"),
        (V("n3", drain_owner=False, panic=True), NODES, "not_owner"),
        (V("n3", quorum_met=False), NODES, "no_quorum"),
        (V("n3", cause_class="job"), NODES, "job_cause"),
        (V("n3", cause_class="job", reason="peer_lag", peer_lag=Lag()), NODES, "job_cause"),
        (V("zz"), NODES, "unknown_node"),
        (V("n3"), [idle("n3", state="down", reason="hw fault"), *NODES[3:]], "down"),
        (
            V("n3"),
            [idle("n3", flags=frozenset({"REBOOT_REQUESTED"})), *NODES[3:]],
            "reboot_pending",
        ),
        (
            V("n3"),
            [idle("n3", flags=frozenset({"DRAIN"}), reason="admin: DIMM"), *NODES[3:]],
            "foreign_reason",
        ),
        (V("n3"), [idle("n3", flags=frozenset({"DRAIN"})), *NODES[3:]], "foreign_reason"),
        (V("n3"), [idle("n3", reason="someone's note"), *NODES[3:]], "foreign_reason"),
    ],
)
def test_skips_say_why(verdict: V, nodes: list[NodeInfo], code: str) -> None:
    (d,) = run([verdict], nodes)
    assert (d.action, d.code) == ("skip", code)
    assert d.reason


@pytest.mark.parametrize("cause", ["hardware", "node", "network", "unknown"])
def test_every_other_class_drains_and_the_reason_ends_with_it(cause: str) -> None:
    (d,) = run([V("n3", cause_class=cause)])
    assert d.action == "drain" and d.reason.endswith(f" class={cause}")


def test_a_skip_is_reported_once_per_reason() -> None:
    memory = DrainMemory()
    assert len(run([V("n3", panic=True)], memory=memory)) == 1
    assert run([V("n3", panic=True)], memory=memory) == []
    (d,) = run([V("n3", quorum_met=False)], memory=memory)
    assert d.code == "no_quorum"
    # recovered, then panics again: reported again
    assert run([], memory=memory) == []
    assert len(run([V("n3", panic=True)], memory=memory)) == 1


def test_already_drained_by_ingero_is_left_as_is() -> None:
    nodes = [idle("n3", flags=frozenset({"DRAIN"}), reason=drain_reason(V("n3"))), *NODES[3:]]
    assert run([V("n3")], nodes) == []


def test_max_fraction_counts_nodes_ingero_holds_and_this_tick() -> None:
    decisions = run([V("n3", score=0.3), V("n4", score=0.4)])
    assert [(d.node, d.action, d.code) for d in decisions] == [
        ("n3", "drain", ""),  # the worst first
        ("n4", "skip", "max_fraction"),
    ]
    held = [idle("n1", flags=frozenset({"DRAIN"}), reason="ingero: straggler ..."), *NODES[1:]]
    (d,) = run([V("n4")], held)
    assert d.code == "max_fraction"


def test_max_fraction_rounds_down() -> None:
    assert max_drained(10, 0.1) == 1
    assert max_drained(9, 0.1) == 0
    assert max_drained(3, 0.34) == 1
    assert max_drained(3, 0.67) == 2
    (d,) = run([V("n1")], NODES[:9])
    assert d.code == "max_fraction"


def test_cooldown_after_ingero_acted() -> None:
    memory = DrainMemory(last_action={"n3": 9_000.0})
    (d,) = run([V("n3")], memory=memory, now=10_000.0)
    assert d.code == "cooldown"
    (d,) = run([V("n3")], memory=DrainMemory(last_action={"n3": 9_000.0}), now=9_000.0 + 1800)
    assert d.action == "drain"


def test_dry_run_only_says_what_it_would_do() -> None:
    (d,) = run([V("n3")], config=dataclasses.replace(ON, dry_run=True))
    assert (d.action, d.code) == ("skip", "dry_run")
    assert drain_reason(V("n3")) in d.reason


AUTO = dataclasses.replace(ON, auto_resume=True, min_intervals=2)
DRAINED = [
    idle("n3", flags=frozenset({"DRAIN"}), reason="ingero: x"),
    idle("n4", flags=frozenset({"DRAIN"}), reason="admin"),
    *NODES[4:],
]


def auto(
    memory: DrainMemory,
    verdicts: list[V] | None = None,
    expired: list[str] | None = None,
    recovered: list[str] | None = None,
) -> list[str]:
    """One auto-resume tick on DRAINED: the nodes it resumes."""
    decisions = run(verdicts or [], DRAINED, AUTO, memory, expired=expired, recovered=recovered)
    assert all(d.action == "resume" for d in decisions)
    return [d.node for d in decisions]


def test_auto_resume_after_recovery_and_min_intervals_ticks() -> None:
    memory = DrainMemory()
    assert auto(memory, [V("n3", consecutive_straggler_ticks=9)]) == []
    assert auto(memory, recovered=["n3", "n4"]) == []  # the recovery tick counts as the first
    # never n4: its reason is not ingero's
    assert auto(memory) == ["n3"]


def test_an_episode_that_ended_idle_never_resumes() -> None:
    memory = DrainMemory()
    assert auto(memory, [V("n3")]) == []
    # the drained node's job ended: Fleet ends the episode "inactive", never "recovered"
    assert auto(memory, expired=["n3"]) == []
    for _ in range(10):
        assert auto(memory) == []


def test_no_evidence_no_resume() -> None:
    # e.g. after a Fleet restart: drained by ingero, but nobody saw it recover
    memory = DrainMemory()
    for _ in range(10):
        assert auto(memory) == []


def test_straggling_again_after_recovery_starts_over() -> None:
    memory = DrainMemory()
    assert auto(memory, recovered=["n3"]) == []
    assert auto(memory, [V("n3")]) == []  # straggler again: eligibility gone
    assert auto(memory) == [] and auto(memory) == []
    assert auto(memory, recovered=["n3"]) == []
    assert auto(memory) == ["n3"]


def test_another_ending_after_recovery_takes_eligibility_away() -> None:
    memory = DrainMemory()
    assert auto(memory, recovered=["n3"]) == []
    assert auto(memory, expired=["n3"]) == []  # expired (or another episode ended otherwise)
    for _ in range(5):
        assert auto(memory) == []


def test_a_recovery_after_an_ending_in_the_same_tick_counts() -> None:
    memory = DrainMemory()
    assert auto(memory, expired=["n3"], recovered=["n3"]) == []
    assert auto(memory) == ["n3"]


def test_any_straggler_verdict_ends_eligibility_panic_or_not() -> None:
    memory = DrainMemory()
    assert auto(memory, recovered=["n3"]) == []
    assert auto(memory, [V("n3", panic=True)]) == []
    assert auto(memory, [V("n3", quorum_met=False)]) == []
    assert auto(memory) == []


def test_no_auto_resume_unless_enabled() -> None:
    memory = DrainMemory()
    for _ in range(10):
        assert run([], DRAINED, ON, memory, recovered=["n3"]) == []
    assert memory.healthy_ticks == {}


def test_ingeros_stale_reason_on_a_resumed_node_claims_nothing() -> None:
    # Slurm 25.11 keeps the last reason after state=resume: ingero's own old reason on an
    # idle node neither blocks a new drain nor counts as a node ingero holds.
    stale = idle("n3", reason=drain_reason(V("n3")))
    assert stale.stale_ingero_reason and not stale.ingero_reason and stale.held_reason is None
    (d,) = run([V("n3")], [*NODES[:2], stale, *NODES[3:]])
    assert d.action == "drain"
    # still drained, or someone else's reason: not stale
    held = idle("n3", flags=frozenset({"DRAIN"}), reason=drain_reason(V("n3")))
    assert held.ingero_reason and not held.stale_ingero_reason
    assert not idle("n3", reason="admin: keep off").stale_ingero_reason
