"""Runs a lock-step training job as one process: each interval, every rank's rows into its
own node DB (one simulated node a rank), as ``ingero trace`` on each node would write them.

The job is ``ingero.workload.lockstep``'s; one process holds every rank, so the pace of the
slowest and a hang reach every rank at once, as they do on a real job. Every rank's rows
carry this process's pid (alive while the job runs, so fleet-push on each node sees its
job's process alive), its job id and its rank.

The control file says what the job is going through now, one line each (re-read every
interval; a new write is applied once, the lines it no longer holds are undone):

- ``rank R S [cause]``: rank R is ``S`` slower (a cause from
  ``ingero.workload.lockstep.LOCKSTEP_CAUSES``; none: its host sleeps);
- ``rank R hang``: rank R stops right before its next collective (its peers wait in it);
  ``rank R hang lost``: the same because its GPU fell off the bus (XID 79, NVML: lost);
- ``stuck``: the collective in flight never completes on any rank (a link down);
- ``phase S``: every rank ``S`` slower (a new phase of the job);
- empty, or ``0``: the job at full speed, a hang or stuck collective released.

A bad line is logged and the file's other lines apply. ``slow_after`` slows ``slow_rank``
by ``slowdown`` that many seconds after the start, ``hang_after`` hangs it; with a jobs
directory template each rank's node gets the job's file, as the Slurm prolog writes it.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import sqlite_utils

from ingero.nodedb.schema import connect
from ingero.nodedb.writer import replace_process
from ingero.runtime.clock import Clock, SystemClock
from ingero.runtime.signals import SignalEvent, StopSignals
from ingero.slurm.jobfile import JobInfo, check_job_id, remove_job, write_job
from ingero.workload.lockstep import LOCKSTEP_CAUSES, JobProfile, LockstepJob, RankRows
from ingero.workload.runner import SyntheticProc, tick_batch, write_tick

log = logging.getLogger(__name__)

# The tables it writes, cut to the last runner.RETAIN_S seconds every 20 intervals.
TABLES = (
    "intervals",
    "gpu_intervals",
    "gpu_processes",
    "host_intervals",
    "stream_intervals",
    "nccl_calls",
    "nccl_comms",
)


@dataclass(frozen=True)
class JobControl:
    """What the control file asks of the job."""

    slow: dict[int, tuple[float, str | None]] = field(default_factory=dict)
    hang: int | None = None
    lost: bool = False  # the hung rank's GPU is lost (XID 79)
    stuck: bool = False
    phase: float = 0.0


def parse_job_control(text: str, ranks: int, where: str = "control file") -> JobControl:
    """The job's condition from the control file's lines (bad ones logged and skipped)."""
    control = JobControl()
    for number, raw in enumerate(text.splitlines(), 1):
        words = raw.split()
        if not words or words == ["0"]:
            continue
        try:
            control = _line(control, words, ranks)
        except ValueError as exc:
            log.warning("%s line %d: %s: %r", where, number, exc, raw.strip()[:60])
    return control


def _line(control: JobControl, words: list[str], ranks: int) -> JobControl:
    head = words[0].lower()
    if head == "stuck" and len(words) == 1:
        return replace(control, stuck=True)
    if head == "phase" and len(words) == 2:
        return replace(control, phase=_slowdown(words[1]))
    if head != "rank" or len(words) < 3:
        raise ValueError("neither 'rank R S [cause]', 'rank R hang [lost]', 'stuck' nor 'phase S'")
    try:
        rank = int(words[1])
    except ValueError:
        raise ValueError(f"rank {words[1]!r} is not a number") from None
    if not 0 <= rank < ranks:
        raise ValueError(f"rank must be in [0, {ranks - 1}]")
    if words[2].lower() == "hang" and len(words) == 3:
        return replace(control, hang=rank)
    if words[2].lower() == "hang" and len(words) == 4 and words[3].lower() == "lost":
        return replace(control, hang=rank, lost=True)
    cause = words[3].lower() if len(words) == 4 else None
    if len(words) > 4 or (cause is not None and cause not in LOCKSTEP_CAUSES):
        raise ValueError(f"a cause is one of {', '.join(LOCKSTEP_CAUSES)}")
    return replace(control, slow={**control.slow, rank: (_slowdown(words[2]), cause)})


def _slowdown(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not 0 <= value < 1:
        raise ValueError("a slowdown is in [0, 1)")
    return value


def expand(template: Path, rank: int, node: str) -> Path:
    """``template`` with ``{rank}`` and ``{node}`` filled in."""
    return Path(str(template).replace("{rank}", str(rank)).replace("{node}", node))


class JobRunner:
    def __init__(
        self,
        db_template: Path,
        profile: JobProfile,
        *,
        interval_s: float = 0.5,
        control: Path | None = None,
        seed: int | None = None,
        clock: Clock | None = None,
        proc_template: Path | None = None,
        jobs_template: Path | None = None,
        nodes: list[str] | None = None,
        cluster_id: str = "default",
        slowdown: float = 0.3,
        cause: str | None = None,
        slow_rank: int = 0,
        slow_after: float | None = None,
        hang_after: float | None = None,
    ) -> None:
        """``db_template`` (and the /proc and jobs directory templates) hold ``{rank}`` or
        ``{node}``; ``nodes`` names each rank's node (default ``node-RR``, from 1)."""
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        if "{rank}" not in str(db_template) and "{node}" not in str(db_template):
            raise ValueError("the node DB path of a job's ranks must hold {rank} or {node}")
        if cause is not None and cause not in LOCKSTEP_CAUSES:
            raise ValueError(f"cause must be one of {', '.join(LOCKSTEP_CAUSES)}")
        if not 0 <= slow_rank < profile.ranks:
            raise ValueError(f"slow_rank must be in [0, {profile.ranks - 1}]")
        if not 0 <= slowdown < 1:
            raise ValueError("slowdown must be in [0, 1)")
        for name, after in (("slow_after", slow_after), ("hang_after", hang_after)):
            if after is not None and after < 0:
                raise ValueError(f"{name} must be >= 0")
        if jobs_template is not None and profile.job_id is not None:
            check_job_id(profile.job_id)
        elif jobs_template is not None:
            raise ValueError("a job file needs a job id")
        self.profile = replace(profile, pid=os.getpid(), same_pid=True)
        self.clock = clock or SystemClock()
        self.nodes = nodes or [f"node-{r + 1:02d}" for r in range(profile.ranks)]
        if len(self.nodes) != profile.ranks:
            raise ValueError("one node name per rank")
        self.dbs = [expand(db_template, r, n) for r, n in enumerate(self.nodes)]
        self.procs = (
            [SyntheticProc(expand(proc_template, r, n)) for r, n in enumerate(self.nodes)]
            if proc_template is not None
            else None
        )
        self.jobs_dirs = (
            [expand(jobs_template, r, n) for r, n in enumerate(self.nodes)]
            if jobs_template is not None
            else None
        )
        self.cluster_id = cluster_id
        self.interval_s = interval_s
        self.control = control
        self.seed = seed
        self.slowdown, self.cause, self.slow_rank = slowdown, cause, slow_rank
        self.slow_after, self.hang_after = slow_after, hang_after
        self.stop_event = SignalEvent()
        self.job: LockstepJob | None = None
        self._stamp: tuple[int, int, str] | None = None
        self._applied = JobControl()

    def install_signals(self) -> None:
        StopSignals(self.stop_event).install()

    def apply(self, wanted: JobControl, now: float) -> None:
        """Make the job what ``wanted`` says: each change from what was applied last."""
        job = self.job
        assert job is not None
        before = self._applied
        for rank in set(before.slow) | set(wanted.slow):
            if before.slow.get(rank) != wanted.slow.get(rank):
                slowdown, cause = wanted.slow.get(rank, (0.0, None))
                job.set_slowdown(rank, slowdown, cause, at=now)
                log.info("rank %d: slowdown %g%s", rank, slowdown, f" ({cause})" if cause else "")
        if wanted.phase != before.phase:
            job.phase(wanted.phase)
            log.info("phase: every rank %g slower", wanted.phase)
        held = (before.hang, before.stuck)
        if (wanted.hang, wanted.stuck) != held:
            if before.hang is not None or before.stuck:
                job.release(now)
                log.info("released: the job goes on")
            if wanted.hang is not None:
                job.hang(wanted.hang, now)
                log.info("rank %d hangs before its next collective", wanted.hang)
            elif wanted.stuck:
                job.stuck(now)
                log.info("the collective in flight never completes on any rank")
        if (
            wanted.lost
            and wanted.hang is not None
            and not (before.lost and before.hang == wanted.hang)
        ):
            job.lose_gpu(wanted.hang)
            log.info("rank %d's GPU fell off the bus (XID 79)", wanted.hang)
        self._applied = wanted

    def _read_control(self) -> JobControl | None:
        """The control file's request when it was written since the last read; else None."""
        if self.control is None:
            return None
        try:
            with self.control.open() as f:
                info = os.fstat(f.fileno())
                text = f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("cannot read control file %s: %s", self.control, exc.strerror)
            return None
        stamp = (info.st_ino, info.st_mtime_ns, text)
        if stamp == self._stamp:
            return None
        self._stamp = stamp
        return parse_job_control(text, self.profile.ranks, str(self.control))

    def run(self, duration_s: float | None = None) -> int:
        """Write until stopped (or ``duration_s``); returns the intervals written."""
        start = self.clock.now()
        self.job = LockstepJob(self.profile, start=start, seed=self.seed)
        dbs = []
        for path in self.dbs:
            path.parent.mkdir(parents=True, exist_ok=True)
            dbs.append(connect(path))
        if self.jobs_dirs is not None:
            for rank, (node, where) in enumerate(zip(self.nodes, self.jobs_dirs, strict=True)):
                job_id = self.profile.job_id
                assert job_id is not None
                info = JobInfo(job_id, self.cluster_id, node, rank, self.profile.ranks, self.nodes)
                write_job(where, replace(info, started_at=start))
        begun = time.monotonic()
        slow_at = None if self.slow_after is None else begun + self.slow_after
        hang_at = None if self.hang_after is None else begun + self.hang_after
        ticks = 0
        try:
            for db in dbs:
                replace_process(
                    db,
                    {"pid": self.profile.pid, "comm": "ingero-workload", "exe": "synthetic",
                     "job_id": self.profile.job_id, "rank": None, "first_seen": start,
                     "last_seen": start},
                )  # fmt: skip
            last = start
            next_tick = time.monotonic() + self.interval_s
            deadline = None if duration_s is None else time.monotonic() + duration_s
            while not self.stop_event.is_set():
                if self.stop_event.wait(max(0.0, next_tick - time.monotonic())):
                    break
                next_tick = time.monotonic() + self.interval_s
                now = self.clock.now()
                wanted = self._read_control()
                mono = time.monotonic()
                if slow_at is not None and mono >= slow_at:
                    slow_at = None
                    slow = {**self._applied.slow, self.slow_rank: (self.slowdown, self.cause)}
                    wanted = replace(wanted or self._applied, slow=slow)
                if hang_at is not None and mono >= hang_at:
                    hang_at = None
                    wanted = replace(wanted or self._applied, hang=self.slow_rank)
                self._write(dbs, last, now, ticks)
                if wanted is not None:
                    # After the interval up to now is written: a change applies from now.
                    self.apply(wanted, now)
                last = now
                ticks += 1
                if deadline is not None and time.monotonic() >= deadline:
                    break
        finally:
            for db in dbs:
                db.conn.close()
            if self.jobs_dirs is not None and self.profile.job_id is not None:
                for where in self.jobs_dirs:
                    remove_job(where, self.profile.job_id)
        return ticks

    def _write(
        self, dbs: list[sqlite_utils.Database], start: float, end: float, ticks: int
    ) -> None:
        job = self.job
        assert job is not None
        for rank, db in enumerate(dbs):
            rows: RankRows = job.rows(rank, start, end)
            if self.procs is not None:
                self.procs[rank].write(end - start, rows.cpu_busy, rows.mem_available)
            batch = replace(
                tick_batch(rows), nccl_calls=rows.nccl_calls, nccl_comms=rows.nccl_comms
            )
            write_tick(db, batch, end, ticks, TABLES)
