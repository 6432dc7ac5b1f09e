"""GPUs held and unused: the ``gpu_idle`` episodes of the jobs on this node (pure).

Which GPUs a job holds comes from its Slurm job file (``gpus``: ``SLURM_JOB_GPUS``, else
``CUDA_VISIBLE_DEVICES``, as the prolog saw them), less the jobs that have ended
(``ingero.slurm.jobcgroup``: an empty job cgroup left behind holds no GPU); a GPU that two
job files name belongs to the newest job. What runs on a GPU comes from the node DB's NVML
rows, one window at a time (``GpuUse``): its busy fraction, the processes NVML lists on it
and whether one of them launched kernels or graphs.

A held GPU is idle in a window when NVML measured it below ``busy_below`` (NVML's 0%) and

- no process is on it (``no_process``), or
- its processes launched nothing and none of them has ever kept it busy while this job
  held it (``zero_busy``).

A GPU the job has used and whose processes then went quiet is not idle: that is a stalled
rank of a running job, a straggler (``docs/health-score.md``, "Stalled is not idle"), and
the stall owns it. A GPU without NVML's busy figure in a window says nothing either way (no
process listed is no proof when NVML could not list them).

Per job and reason, the GPUs idle for ``idle_after`` make one episode: ``start`` with its
``event_id``, the GPUs and ``since`` (when they became idle), ``end`` with the same id and
``idle_s`` once the set changes (a GPU used again, another idle long enough: the next
episode counts from the change, so the GPU-hours of a job's episodes add up), the job ends
or lets the GPUs go. Times are the node DB's (the windows' ends), on this host's clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from ingero.nodedb.window import GpuWindow
from ingero.schema.events import Event, new_event_id
from ingero.slurm.jobfile import JobInfo

Reason = Literal["no_process", "zero_busy"]
REASONS: Final[tuple[Reason, ...]] = ("no_process", "zero_busy")


@dataclass(frozen=True)
class HeldJob:
    """A Slurm job running on this node and the GPUs (NVML indices) it holds."""

    job_id: str
    gpus: tuple[int, ...]
    user: str | None = None
    partition: str | None = None
    rank: int | None = None
    started_at: float | None = None


@dataclass(frozen=True)
class GpuUse:
    """One GPU over one window, as far as idleness goes."""

    busy: float | None  # NVML's busy fraction; None: not measured
    processes: int = 0  # processes NVML listed on it
    launched: bool = False  # one of them launched kernels or graphs in the window


@dataclass(frozen=True)
class IdleChange:
    """An episode starting or ending."""

    state: Literal["start", "end"]
    event_id: str
    job: HeldJob
    gpus: tuple[int, ...]
    since: float
    reason: Reason
    idle_s: float | None = None  # at the end
    end: str | None = None  # at the end: used | changed | job_ended


@dataclass
class _Gpu:
    worked: bool = False  # kept busy while this job held it
    idle_since: float | None = None
    reason: Reason | None = None
    active_until: float | None = None  # the end of the last window it was not idle in


@dataclass
class _Episode:
    event_id: str
    gpus: tuple[int, ...]
    since: float


@dataclass
class _Job:
    job: HeldJob
    gpus: dict[int, _Gpu] = field(default_factory=dict)
    episodes: dict[Reason, _Episode] = field(default_factory=dict)


def held_jobs(jobs: Sequence[JobInfo], cgroups: Mapping[str, bool] | None) -> list[HeldJob]:
    """The jobs holding GPUs now, from their job files: the GPUs each names by index (a
    UUID in CUDA_VISIBLE_DEVICES names none), less the jobs whose cgroup is there and empty
    (``cgroups``: ``ingero.slurm.jobcgroup.job_cgroups``; the job ended, its stale cgroup
    holds no GPU); a GPU two job files name is the newest job's."""
    newest = sorted(jobs, key=lambda j: -(j.started_at or 0.0))
    taken: set[int] = set()
    out: list[HeldJob] = []
    for job in newest:
        if cgroups is not None and cgroups.get(job.job_id) is False:
            continue
        gpus = tuple(sorted({int(g) for g in job.gpus if g.isdecimal()} - taken))
        taken.update(gpus)
        if gpus:
            out.append(HeldJob(job.job_id, gpus, job.user, job.partition, job.rank, job.started_at))
    return out


def gpu_uses(gpus: Mapping[int, GpuWindow], launch_pids: Iterable[int]) -> dict[int, GpuUse]:
    """What one node DB window says of each GPU's use (``ingero.nodedb.window``)."""
    launched = set(launch_pids)
    return {
        index: GpuUse(g.busy, len(g.pids), any(p in launched for p in g.pids))
        for index, g in gpus.items()
    }


class GpuIdleDetector:
    def __init__(self, idle_after: float, busy_below: float) -> None:
        if idle_after <= 0 or not 0 < busy_below <= 1:
            raise ValueError("idle_after must be > 0 and busy_below in (0, 1]")
        self.idle_after = idle_after
        self.busy_below = busy_below
        self._jobs: dict[str, _Job] = {}

    def open(self) -> list[IdleChange]:
        """The episodes open now (as their start said them)."""
        return [
            IdleChange("start", e.event_id, j.job, e.gpus, e.since, reason)
            for j in self._jobs.values()
            for reason, e in sorted(j.episodes.items())
        ]

    def observe(
        self, jobs: Sequence[HeldJob], gpus: Mapping[int, GpuUse], start: float, end: float
    ) -> list[IdleChange]:
        """One window ``(start, end]`` of the node DB: the episodes that start or end."""
        changes: list[IdleChange] = []
        held = {job.job_id: job for job in jobs}
        for job_id in [j for j in self._jobs if j not in held]:
            gone = self._jobs.pop(job_id)
            changes += self._close(gone, gone.episodes, end, "job_ended")
        for job in jobs:
            state = self._jobs.setdefault(job.job_id, _Job(job))
            state.job = job
            for index in [g for g in state.gpus if g not in job.gpus]:
                del state.gpus[index]
            for index in job.gpus:
                use = gpus.get(index)
                if use is not None:
                    self._track(state.gpus.setdefault(index, _Gpu()), use, job, start, end)
            changes += self._episodes(state, end)
        return changes

    def _track(self, g: _Gpu, use: GpuUse, job: HeldJob, start: float, end: float) -> None:
        if use.busy is None:
            return  # not measured: no evidence either way
        if use.busy >= self.busy_below:
            g.worked = True
            reason: Reason | None = None
        elif use.processes == 0:
            reason = "no_process"
        elif use.launched or g.worked:
            reason = None  # launching elsewhere, or a stalled rank: not idle
        else:
            reason = "zero_busy"
        if reason is None:
            g.idle_since, g.reason, g.active_until = None, None, end
            return
        if g.idle_since is None:
            bounds = [start, g.active_until, job.started_at]
            g.idle_since = max(b for b in bounds if b is not None)
        g.reason = reason

    def _episodes(self, state: _Job, end: float) -> list[IdleChange]:
        idle: dict[Reason, list[int]] = {}
        for index, g in sorted(state.gpus.items()):
            since = g.idle_since
            if g.reason is not None and since is not None and end - since >= self.idle_after:
                idle.setdefault(g.reason, []).append(index)
        changes: list[IdleChange] = []
        for reason in REASONS:
            now = tuple(idle.get(reason, ()))
            episode = state.episodes.get(reason)
            if episode is not None and episode.gpus == now:
                continue
            since = None
            if episode is not None:
                changes += self._close(state, {reason: episode}, end, "changed" if now else "used")
                del state.episodes[reason]
                since = end  # the next one counts from the change
            if now:
                if since is None:
                    since = max(float(state.gpus[i].idle_since or end) for i in now)
                new = _Episode(new_event_id(), now, since)
                state.episodes[reason] = new
                changes.append(IdleChange("start", new.event_id, state.job, now, since, reason))
        return changes

    @staticmethod
    def _close(
        state: _Job, episodes: Mapping[Reason, _Episode], end: float, why: str
    ) -> list[IdleChange]:
        return [
            IdleChange(
                "end", e.event_id, state.job, e.gpus, e.since, reason, max(0.0, end - e.since), why
            )
            for reason, e in sorted(episodes.items())
        ]


def idle_events(
    changes: Iterable[IdleChange], *, node_id: str, cluster_id: str, timestamp: float
) -> list[Event]:
    """The changes as ``gpu_idle`` events of the common schema."""
    out = []
    for c in changes:
        extra: dict[str, object] = {
            "state": c.state,
            "gpus": list(c.gpus),
            "user": c.job.user,
            "partition": c.job.partition,
            "since": round(c.since, 3),
            "reason": c.reason,
        }
        if c.state == "end":
            extra["idle_s"] = round(c.idle_s or 0.0, 3)
            extra["end"] = c.end
        out.append(
            Event(
                type="gpu_idle",
                node_id=node_id,
                cluster_id=cluster_id,
                timestamp=timestamp,
                event_id=c.event_id,
                job_id=c.job.job_id,
                rank=c.job.rank,
                extra=extra,
            )
        )
    return out
