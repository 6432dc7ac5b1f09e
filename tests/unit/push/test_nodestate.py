"""Node state machine: warm-up count, idle count, stale and recovery."""

from __future__ import annotations

import pytest

from ingero.push.nodestate import NodeStateMachine
from ingero.runtime.clock import ManualClock


def machine(
    warmup: int = 3,
    idle_after: int = 2,
    warm: int = 0,
    stall_intervals: int = 1,
    stall_after: float = 0.0,
) -> NodeStateMachine:
    return NodeStateMachine(
        warmup_samples=warmup,
        idle_after=idle_after,
        clock=ManualClock(),
        warm_samples=warm,
        stall_intervals=stall_intervals,
        stall_after=stall_after,
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
    m = NodeStateMachine(
        warmup_samples=1, idle_after=1, clock=clock, stall_intervals=1, stall_after=0.0
    )
    clock.advance(10)
    t = m.observe(readable=True, kernel_launches=1)
    assert m.since == 10.0
    assert t is not None and t.at == clock.now()


@pytest.mark.parametrize(("warmup", "idle", "stall"), [(0, 1, 1), (1, 0, 1), (1, 1, 0)])
def test_bad_settings_are_rejected(warmup: int, idle: int, stall: int) -> None:
    with pytest.raises(ValueError):
        NodeStateMachine(
            warmup_samples=warmup,
            idle_after=idle,
            clock=ManualClock(),
            stall_intervals=stall,
            stall_after=0.0,
        )


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


# One sample: (new tracer intervals, their seconds, kernel launches); (0, 0, 0) is no data.
Sample = tuple[int, float, int]
WORK: Sample = (1, 1.0, 500)
QUIET: Sample = (1, 1.0, 0)
NO_DATA: Sample = (0, 0.0, 0)


@pytest.mark.parametrize(
    ("stall_intervals", "stall_after", "samples", "stalled_after"),
    [
        # Tracer and pushes at one interval: a stall takes 2 quiet intervals, whatever
        # windows without data come between (a late write, a push ahead of the tracer).
        (2, 0.0, [QUIET, QUIET], [False, True]),
        (2, 0.0, [QUIET, NO_DATA, NO_DATA, QUIET], [False, False, False, True]),
        (2, 0.0, [NO_DATA] * 5, [False] * 5),
        # Work between quiet intervals starts the count again.
        (2, 0.0, [QUIET, WORK, QUIET, QUIET], [False, False, False, True]),
        # Pushes 5x the tracer interval: one window of 5 quiet intervals is a stall.
        (2, 0.0, [(5, 5.0, 0)], [True]),
        # Tracer 5x the push interval: 4 pushes of 5 find nothing new.
        (2, 0.0, [(1, 5.0, 0), *[NO_DATA] * 4, (1, 5.0, 0)], [False] * 5 + [True]),
        # A configured duration on top: 2 intervals of 0.25 s are not yet 1 s.
        (2, 1.0, [(2, 0.5, 0), (2, 0.5, 0)], [False, True]),
        (1, 0.0, [QUIET], [True]),
    ],
)
def test_a_stall_needs_covered_quiet_intervals_and_no_data_is_none(
    stall_intervals: int, stall_after: float, samples: list[Sample], stalled_after: list[bool]
) -> None:
    m = machine(warmup=1, idle_after=2, stall_intervals=stall_intervals, stall_after=stall_after)
    m.observe(readable=True, kernel_launches=5)
    seen = []
    for intervals, seconds, launches in samples:
        m.observe(
            readable=True,
            kernel_launches=launches,
            job_running=True,
            intervals=intervals,
            covered_s=seconds,
        )
        seen.append(m.stalled)
        assert m.state == "active"  # a running job: never idle, whatever the samples
    assert seen == stalled_after


@pytest.mark.parametrize(
    ("before", "job_running", "after"),
    [
        ("active", True, "active"),
        ("active", None, "active"),  # no data is not quiet: it never counts towards idle
        ("stalled", True, "stalled"),  # a stall is kept through a window without data
        ("stalled", None, "stalled"),
        ("active", False, "idle"),  # ...but a job that has ended is idle at once
        ("stalled", False, "idle"),
    ],
)
def test_a_window_without_data_keeps_the_state(
    before: str, job_running: bool | None, after: str
) -> None:
    m = machine(warmup=1, idle_after=1, stall_intervals=1)
    m.observe(readable=True, kernel_launches=5)
    if before == "stalled":
        m.observe(readable=True, job_running=True)
    for _ in range(4):
        m.observe(readable=True, job_running=job_running, intervals=0)
    assert ("stalled" if m.stalled else m.state) == after


def test_a_silent_tracer_is_stale_with_its_reason_and_not_stalled() -> None:
    m = machine(warmup=1, idle_after=2, stall_intervals=1)
    m.observe(readable=True, kernel_launches=5)
    m.observe(readable=True, job_running=True)
    assert m.stalled
    t = m.observe(readable=False, reason="the tracer wrote nothing for 20 s")
    assert m.state == "stale" and not m.stalled
    assert t is not None and t.reason == "the tracer wrote nothing for 20 s"


def waiting_machine(wait_samples: int = 3) -> NodeStateMachine:
    m = NodeStateMachine(
        warmup_samples=1, idle_after=2, clock=ManualClock(), stall_intervals=2,
        stall_after=0.0, wait_samples=wait_samples,
    )  # fmt: skip
    m.observe(readable=True, kernel_launches=5)
    return m


def quiet(m: NodeStateMachine, **kw: bool) -> None:
    m.observe(readable=True, job_running=True, at_collective=True, **kw)


def test_a_quiet_rank_with_peers_waits_for_fleet_s_view_then_falls_back_to_a_stall() -> None:
    """Alone, a quiet node with an NCCL rank among peers cannot tell whether it waits for
    one of them or holds them back: pending (held), not stalled, for ``wait_samples``
    quiet samples; with no word from Fleet its quiet is then a stall as before."""
    m = waiting_machine(wait_samples=3)
    for _ in range(3):
        quiet(m)
        assert (m.pending, m.stalled, m.quiet, m.state) == (True, False, True, "active")
    quiet(m)
    assert m.stalled and not m.pending


def test_fleet_saying_the_rank_waits_keeps_it_waiting_however_long() -> None:
    m = waiting_machine(wait_samples=2)
    quiet(m)
    for _ in range(20):
        quiet(m, fleet_wait=True)
        assert (m.waiting, m.stalled, m.pending, m.state) == (True, False, False, "active")
    # Fleet stops saying so (the others went on, this one did not): its quiet counts again.
    for _ in range(2):
        quiet(m)
        assert m.pending and not m.stalled
    quiet(m)
    assert m.stalled


def test_fleet_naming_the_rank_the_others_wait_for_makes_its_quiet_a_stall_at_once() -> None:
    m = waiting_machine(wait_samples=5)
    quiet(m)
    assert m.pending
    quiet(m, waited_for=True)
    assert m.stalled and not m.waiting
    # Back at work: neither.
    m.observe(readable=True, kernel_launches=3)
    assert not (m.stalled or m.waiting or m.quiet or m.pending)


def test_without_peers_a_quiet_node_stalls_as_before() -> None:
    m = waiting_machine(wait_samples=5)
    m.observe(readable=True, job_running=True)
    assert m.pending and not m.stalled
    m.observe(readable=True, job_running=True)
    assert m.stalled
