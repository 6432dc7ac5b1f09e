"""Node state machine: calibrating → active ⇄ idle, and stale while the node DB is unreadable
or its tracer silent.

Pure: driven by one observation per sample and an injectable clock (for when a state began).
Only ``active`` nodes are classified against their peers.

A sample without data is no measurement: where the tracer wrote no interval since the last
sample (it writes a few ms late, or on a longer cadence than the pushes), the node keeps its
state, stalled or not, and nothing counts towards idle or a stall (``intervals`` 0). Only a
job known to have ended moves it (to idle).

Stalled is not idle: a warmed-up node that launches nothing while its job still runs (the
caller says so: the job's processes are alive, or its job file is present) stays ``active``
with ``stalled`` set, so it keeps being classified and counted by Fleet; it is a straggler
while its peers go on. A stall is measured: the tracer's intervals since the last launch
cover at least ``stall_intervals`` intervals and ``stall_after`` seconds (a scheduling
hiccup of one interval is not one); until then the quiet node is ``pending`` (the caller
holds its last measurement). A node whose job is known to have ended is idle at once (its last
quiet samples are no measurement of it); only where nothing tells whether a job runs does
the old rule hold: idle after ``idle_after`` quiet samples.

Waiting is not stalled either: a node whose NCCL rank is inside a collective (entered, not
returned) launches nothing because it waits for a peer at the collective's barrier, and so
does one whose rank entered a collective and returned at enqueue, as real NCCL's calls
do, to wait in a stream sync: Fleet, comparing the ranks, says so in its reply
(``fleet_wait``; ``ingero.push.waiting``). In a job-wide hang every rank but the missing
one is such a victim; Fleet names the one they wait for, so the victims stay ``active``,
not stalled (``waiting`` set), and their quiet samples count towards neither idle nor a
stall. A quiet node with a rank in a communicator with peers (``at_collective``) cannot
tell alone whether it waits or holds the others back: it is pending until Fleet says,
for at most ``wait_samples`` quiet samples, and a stall at once when Fleet names its rank
as the one the others wait for (``waited_for``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ingero.otlp.health import NodeState
from ingero.runtime.clock import Clock


@dataclass(frozen=True)
class Transition:
    previous: NodeState
    current: NodeState
    reason: str
    at: float


class NodeStateMachine:
    """Counts samples with GPU work towards warm-up and samples without it towards idle."""

    def __init__(
        self,
        *,
        warmup_samples: int,
        idle_after: int,
        clock: Clock,
        warm_samples: int = 0,
        stall_intervals: int,
        stall_after: float,
        wait_samples: int = 5,
    ) -> None:
        if warmup_samples < 1 or idle_after < 1 or stall_intervals < 1:
            raise ValueError("warmup_samples, idle_after and stall_intervals must be >= 1")
        self.warmup_samples = warmup_samples
        self.idle_after = idle_after
        self.stall_intervals = stall_intervals
        self.stall_after = stall_after
        self.clock = clock
        # The tracer intervals (and their seconds) since the last one with kernel launches.
        self.quiet_intervals = 0
        self.quiet_s = 0.0
        # Quiet, the job runs, but not yet quiet long enough to be a stall.
        self.pending = False
        # Samples with work seen so far, including those restored from a baseline file.
        self.work_samples = warm_samples
        self.quiet_samples = 0
        self.state: NodeState = "active" if self.warmed_up else "calibrating"
        self.stalled = False  # active, the job runs, but no kernel launches
        self.wait_samples = wait_samples
        # Quiet while the job runs (stalled, waiting or not yet either), the last sample.
        self.quiet = False
        # Quiet because a rank waits at a collective (Fleet said so, or inside the call).
        self.waiting = False
        # Quiet samples in a row with a rank at a collective and no word from Fleet.
        self.unjudged = 0
        self.since = clock.monotonic()

    @property
    def warmed_up(self) -> bool:
        return self.work_samples >= self.warmup_samples

    def observe(
        self,
        *,
        readable: bool,
        kernel_launches: int = 0,
        job_running: bool | None = None,
        waiting: bool = False,
        intervals: int = 1,
        covered_s: float = 0.0,
        reason: str | None = None,
        at_collective: bool = False,
        fleet_wait: bool = False,
        waited_for: bool = False,
    ) -> Transition | None:
        """Feed one sample; returns the transition it caused, if any.

        ``job_running``: whether this node's job still runs (True), has ended (False), or
        nothing tells (None); it matters only for samples without kernel launches.
        ``waiting``: a rank of this node is inside an NCCL collective (waits for its peers).
        ``intervals``, ``covered_s``: the new tracer intervals the sample covers and their
        seconds (0 intervals: no data); ``reason``: why an unreadable sample is stale.
        ``at_collective``: a rank of the node is in a communicator with peers; Fleet's last
        reply said it waits for others (``fleet_wait``) or that others wait for it
        (``waited_for``).
        """
        self.pending = False
        if not readable:
            self.stalled = self.quiet = self.waiting = False
            self.unjudged = 0
            return self._move("stale", reason or "node DB cannot be read")
        if intervals <= 0:
            # No data: nothing was measured, so nothing changes, unless the job has ended.
            if job_running is False:
                self.stalled = False
                return self._move("idle", "the job has ended")
            return None
        self.stalled = self.quiet = self.waiting = False
        if kernel_launches > 0:
            self.unjudged = 0
            self.quiet_samples = 0
            self.quiet_intervals, self.quiet_s = 0, 0.0
            self.work_samples += 1
            if self.warmed_up:
                return self._move("active", "GPU work seen")
            return self._move("calibrating", f"warm-up {self.work_samples}/{self.warmup_samples}")
        self.quiet = job_running is not False
        if (waiting or fleet_wait) and job_running is not False and not waited_for:
            # At a collective's barrier: neither stalled nor quiet towards idle or a stall.
            self.quiet_intervals, self.quiet_s = 0, 0.0
            self.unjudged = 0
            self.waiting = True
            return None
        self.quiet_samples += 1
        self.quiet_intervals += intervals
        self.quiet_s += covered_s
        if job_running is True and self.warmed_up and self.state in ("active", "stale"):
            if at_collective and not waited_for and self.unjudged < self.wait_samples:
                # Waiting for a peer or holding them back: Fleet's view of the ranks says.
                self.unjudged += 1
                self.pending = True
                return self._move("active", "node DB readable again")
            stall = (
                self.quiet_intervals >= self.stall_intervals and self.quiet_s >= self.stall_after
            )
            if stall or waited_for:
                self.stalled = True
                return self._move("active", "stalled: the job runs but launches nothing")
            self.pending = True
            return self._move("active", "node DB readable again")
        if job_running is False:
            return self._move("idle", "no kernel launches and the job has ended")
        if self.quiet_samples >= self.idle_after:
            return self._move("idle", f"no kernel launches for {self.quiet_samples} samples")
        if self.state == "stale":
            # Readable again but not yet quiet long enough to call idle.
            return self._move(
                "active" if self.warmed_up else "calibrating", "node DB readable again"
            )
        return None

    def _move(self, state: NodeState, reason: str) -> Transition | None:
        if state == self.state:
            return None
        transition = Transition(self.state, state, reason, self.clock.now())
        self.state = state
        self.since = self.clock.monotonic()
        return transition
