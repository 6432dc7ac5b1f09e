"""Node state machine: warm-up count, idle count, stale and recovery."""

from __future__ import annotations

import pytest

from ingero.push.nodestate import NodeStateMachine
from ingero.runtime.clock import ManualClock


def machine(warmup: int = 3, idle_after: int = 2, warm: int = 0) -> NodeStateMachine:
    return NodeStateMachine(
        warmup_samples=warmup, idle_after=idle_after, clock=ManualClock(), warm_samples=warm
    )


def test_calibrating_for_exactly_warmup_samples() -> None:
    m = machine(warmup=3)
    assert m.state == "calibrating"
    m.observe(readable=True, kernel_launches=10)
    m.observe(readable=True, kernel_launches=10)
    assert m.state == "calibrating"
    t = m.observe(readable=True, kernel_launches=10)
    assert m.state == "active"
    assert t is not None and (t.previous, t.current) == ("calibrating", "active")


def test_restored_baseline_skips_warmup() -> None:
    assert machine(warmup=3, warm=3).state == "active"
    assert machine(warmup=3, warm=2).state == "calibrating"


def test_idle_after_exactly_n_quiet_samples_and_back_on_work() -> None:
    m = machine(warmup=1, idle_after=2)
    m.observe(readable=True, kernel_launches=5)
    assert m.state == "active"
    assert m.observe(readable=True, kernel_launches=0) is None
    assert m.state == "active"
    t = m.observe(readable=True, kernel_launches=0)
    assert m.state == "idle" and t is not None
    m.observe(readable=True, kernel_launches=0)
    assert m.state == "idle"
    t = m.observe(readable=True, kernel_launches=1)
    assert m.state == "active" and t is not None and t.previous == "idle"


def test_quiet_samples_reset_on_work() -> None:
    m = machine(warmup=1, idle_after=2)
    m.observe(readable=True, kernel_launches=5)
    m.observe(readable=True, kernel_launches=0)
    m.observe(readable=True, kernel_launches=5)
    m.observe(readable=True, kernel_launches=0)
    assert m.state == "active"


def test_quiet_samples_do_not_count_towards_warmup() -> None:
    m = machine(warmup=2, idle_after=5)
    for _ in range(4):
        m.observe(readable=True, kernel_launches=0)
    assert m.state == "calibrating"
    m.observe(readable=True, kernel_launches=1)
    m.observe(readable=True, kernel_launches=1)
    assert m.state == "active"


def test_idle_node_returning_before_warmup_calibrates() -> None:
    m = machine(warmup=3, idle_after=1)
    m.observe(readable=True, kernel_launches=0)
    assert m.state == "idle"
    m.observe(readable=True, kernel_launches=3)
    assert m.state == "calibrating"


@pytest.mark.parametrize("before", ["calibrating", "active", "idle"])
def test_unreadable_db_is_stale_from_any_state(before: str) -> None:
    m = machine(warmup=1, idle_after=1)
    if before == "active":
        m.observe(readable=True, kernel_launches=1)
    elif before == "idle":
        m.observe(readable=True, kernel_launches=0)
    assert m.state == before
    t = m.observe(readable=False)
    assert m.state == "stale"
    assert t is not None and t.previous == before and "cannot be read" in t.reason
    assert m.observe(readable=False) is None  # a transition is reported once


def test_stale_recovers_to_active_with_work() -> None:
    m = machine(warmup=1, idle_after=3)
    m.observe(readable=True, kernel_launches=1)
    m.observe(readable=False)
    t = m.observe(readable=True, kernel_launches=7)
    assert m.state == "active" and t is not None and t.previous == "stale"


def test_stale_recovers_when_readable_even_before_work() -> None:
    m = machine(warmup=1, idle_after=3)
    m.observe(readable=True, kernel_launches=1)
    m.observe(readable=False)
    m.observe(readable=True, kernel_launches=0)
    assert m.state == "active"
    m.observe(readable=True, kernel_launches=0)
    m.observe(readable=True, kernel_launches=0)
    assert m.state == "idle"


def test_stale_does_not_lose_warmup_progress() -> None:
    m = machine(warmup=2, idle_after=3)
    m.observe(readable=True, kernel_launches=1)
    m.observe(readable=False)
    m.observe(readable=True, kernel_launches=1)
    assert m.state == "active"


def test_since_follows_the_clock() -> None:
    clock = ManualClock()
    m = NodeStateMachine(warmup_samples=1, idle_after=1, clock=clock)
    clock.advance(10)
    t = m.observe(readable=True, kernel_launches=1)
    assert m.since == 10.0
    assert t is not None and t.at == clock.now()


@pytest.mark.parametrize(("warmup", "idle"), [(0, 1), (1, 0)])
def test_bad_settings_are_rejected(warmup: int, idle: int) -> None:
    with pytest.raises(ValueError):
        NodeStateMachine(warmup_samples=warmup, idle_after=idle, clock=ManualClock())


@pytest.mark.parametrize(
    ("job_running", "waiting", "stalled", "state"),
    [
        (True, False, True, "active"),  # the job runs, nothing launched: stalled
        (True, True, False, "active"),  # inside a collective: a victim waiting, not stalled
        (None, True, False, "active"),  # nothing says the job runs, but a rank waits inside
        (False, True, False, "idle"),  # the job has ended: idle whatever the last rows say
    ],
)
def test_a_rank_waiting_inside_a_collective_is_not_stalled(
    job_running: bool | None, waiting: bool, stalled: bool, state: str
) -> None:
    m = machine(warmup=1, idle_after=2)
    m.observe(readable=True, kernel_launches=5)
    for _ in range(4):  # more quiet samples than idle_after
        m.observe(readable=True, job_running=job_running, waiting=waiting)
    assert (m.stalled, m.state) == (stalled, state)
