"""Node state machine: calibrating → active ⇄ idle, and stale while the node DB is unreadable.

Pure: driven by one observation per sample and an injectable clock (for when a state began).
Only ``active`` nodes are classified against their peers.

Stalled is not idle: a warmed-up node that launches nothing while its job still runs (the
caller says so: the job's processes are alive, or its job file is present) stays ``active``
with ``stalled`` set, so it keeps being classified and counted by Fleet; it is a straggler
while its peers go on. A node whose job is known to have ended is idle at once (its last
quiet samples are no measurement of it); only where nothing tells whether a job runs does
the old rule hold: idle after ``idle_after`` quiet samples.

Waiting is not stalled either: a node whose NCCL rank is inside a collective (entered, not
returned) launches nothing because it waits for a peer at the collective's barrier. In a
job-wide hang every rank but the missing one is such a victim; Fleet's ``collective_hang``
names the one that never arrived, so the victims stay ``active``, not stalled, and their
quiet samples do not count towards idle.
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
        self, *, warmup_samples: int, idle_after: int, clock: Clock, warm_samples: int = 0
    ) -> None:
        if warmup_samples < 1 or idle_after < 1:
            raise ValueError("warmup_samples and idle_after must be >= 1")
        self.warmup_samples = warmup_samples
        self.idle_after = idle_after
        self.clock = clock
        # Samples with work seen so far, including those restored from a baseline file.
        self.work_samples = warm_samples
        self.quiet_samples = 0
        self.state: NodeState = "active" if self.warmed_up else "calibrating"
        self.stalled = False  # active, the job runs, but no kernel launches
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
    ) -> Transition | None:
        """Feed one sample; returns the transition it caused, if any.

        ``job_running``: whether this node's job still runs (True), has ended (False), or
        nothing tells (None); it matters only for samples without kernel launches.
        ``waiting``: a rank of this node is inside an NCCL collective (waits for its peers).
        """
        self.stalled = False
        if not readable:
            return self._move("stale", "node DB cannot be read")
        if kernel_launches > 0:
            self.quiet_samples = 0
            self.work_samples += 1
            if self.warmed_up:
                return self._move("active", "GPU work seen")
            return self._move("calibrating", f"warm-up {self.work_samples}/{self.warmup_samples}")
        if waiting and job_running is not False:
            return None  # at a collective's barrier: neither stalled nor quiet towards idle
        self.quiet_samples += 1
        if job_running is True and self.warmed_up and self.state in ("active", "stale"):
            self.stalled = True
            return self._move("active", "stalled: the job runs but launches nothing")
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
