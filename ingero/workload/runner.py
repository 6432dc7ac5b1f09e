"""Runs the synthetic workload as a process: one write to the node DB per interval.

Each interval starts where the last one ended and lasts at least the interval, as ``ingero
trace``'s do: a late one (a loaded node) is longer, and the next is a whole interval again.

The slowdown can change at run time: a control file holding a number (``0.3``), optionally
followed by the cause of the slowdown (``0.3 io``; ``ingero.workload.generator.CAUSES``), is
re-read every interval (``for N`` after either, ``0.3 for 2``: the next N intervals only,
counted by the runner); SIGUSR1 toggles the ``--slowdown`` value (with its ``--cause``) on and
off, and ``slow_after`` turns it on that many seconds after the start. The control file
holding ``stall`` stops the process's work (as a hung or SIGSTOPped rank: no calls, its GPU
idle but still held), and so does ``stall_after`` seconds after the start. With a jobs
directory the runner writes the job's file there at start, as the Slurm prolog does, keeps
it while it runs (stalled or not) and removes it on exit, as the epilog does. ``late``
writes each interval's rows up to that many seconds after the interval ends (their times
unchanged), as a tracer delayed by a loaded node does. With the ``inference`` shape and a
synthetic /proc, each server gets a process entry there (a Triton command line with its
/metrics turned off: nothing answers for a synthetic server), so fleet-push pointed at it
(``inference.proc_root``) recognises the servers and reads their decode streams.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType

import sqlite_utils

from ingero.nodedb.schema import connect
from ingero.nodedb.writer import Batch, delete_before, insert_batch, replace_process
from ingero.runtime.clock import Clock, SystemClock
from ingero.runtime.signals import SignalEvent, StopSignals
from ingero.slurm.jobfile import JobInfo, check_job_id, remove_job, write_job
from ingero.workload.generator import CAUSES, TickRows, WorkloadGenerator, WorkloadProfile

log = logging.getLogger(__name__)

RETAIN_S = 600.0  # rows older than this are deleted so a long demo keeps a small DB
RETAINED = ("intervals", "gpu_intervals", "gpu_processes", "host_intervals", "stream_intervals")


def tick_batch(rows: TickRows) -> Batch:
    """The node DB rows of one generated interval."""
    return Batch(
        intervals=rows.intervals,
        gpu_intervals=rows.gpu_intervals,
        gpu_processes=rows.gpu_processes,
        host_intervals=rows.host_intervals,
        stream_intervals=rows.stream_intervals,
    )


def write_tick(
    db: sqlite_utils.Database,
    batch: Batch,
    end: float,
    ticks: int,
    tables: Sequence[str] = RETAINED,
) -> None:
    """One interval's rows in one transaction; every 20th interval also cuts ``tables`` to
    the last :data:`RETAIN_S` seconds before ``end``."""
    with db.conn:
        insert_batch(db, batch)
        if ticks % 20 == 0:
            delete_before(db, end - RETAIN_S, tables)


# What the synthetic inference servers serve.
SERVED_MODEL = "llama-3.1-8b"


STALL = "stall"


@dataclass(frozen=True)
class Control:
    slowdown: float = 0.0
    stalled: bool = False
    cause: str | None = None  # what the slowdown comes from; None: the runner's own cause
    # ``for N``: the next N intervals run so, later ones at full speed until the file is
    # written again. None: every interval while the file says so.
    intervals: int | None = None


# A control file as written: its inode, modification time and text (a new write is a new
# request, though the clock's tick may give it the time of the one before).
Stamp = tuple[int, int, str]


def read_control(path: Path) -> tuple[Control, Stamp] | None:
    """What a control file asks for (a slowdown and its cause, or ``stall``) with the stamp
    of the write it read; None when absent, or (logged) for a bad value."""
    try:
        with path.open() as f:
            info = os.fstat(f.fileno())
            text = f.read().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("cannot read control file %s: %s", path, exc.strerror)
        return None
    control = parse_control(path, text)
    return (control, (info.st_ino, info.st_mtime_ns, text)) if control is not None else None


def parse_control(path: Path, text: str) -> Control | None:
    """A control file's text (``0.3``, ``0.3 io``, ``stall``, each optionally followed by
    ``for N``), None (logged) where it is none of those."""
    words = text.split()
    intervals = None
    if len(words) >= 2 and words[-2].lower() == "for":
        try:
            intervals = int(words[-1])
        except ValueError:
            intervals = 0
        if intervals < 1:
            log.warning("control file %s: 'for' needs a whole number of intervals >= 1", path)
            return None
        text = " ".join(words[:-2])
    if not text:
        return Control(intervals=intervals)
    if text.lower() == STALL:
        return Control(stalled=True, intervals=intervals)
    number, _, cause = text.partition(" ")
    cause = cause.strip().lower()
    try:
        value = float(number)
    except ValueError:
        log.warning("control file %s: neither a number nor %r: %r", path, STALL, text[:40])
        return None
    if not 0 <= value < 1:
        log.warning("control file %s: slowdown %r outside [0, 1)", path, value)
        return None
    if cause and cause not in CAUSES:
        log.warning("control file %s: cause %r is none of %s", path, cause[:40], ", ".join(CAUSES))
        return None
    return Control(slowdown=value, cause=cause or None, intervals=intervals)


class SyntheticProc:
    """A /proc tree (stat, meminfo) for a simulated host, replaced atomically every tick."""

    CPUS = 32
    HZ = 100
    MEM_TOTAL_KIB = 512 * 2**20

    def __init__(self, root: Path) -> None:
        self.root = root
        self.busy = 0
        self.idle = 0
        root.mkdir(parents=True, exist_ok=True)

    def write(self, dt: float, cpu_busy: float, mem_available: float) -> None:
        jiffies = round(dt * self.HZ * self.CPUS)
        busy = round(jiffies * cpu_busy)
        self.busy += busy
        self.idle += jiffies - busy
        user, system = self.busy * 4 // 5, self.busy - self.busy * 4 // 5
        self._replace("stat", f"cpu  {user} 0 {system} {self.idle} 0 0 0 0 0 0\n")
        available = int(self.MEM_TOTAL_KIB * mem_available)
        self._replace(
            "meminfo",
            f"MemTotal:       {self.MEM_TOTAL_KIB} kB\nMemAvailable:   {available} kB\n",
        )

    def servers(self, pids: tuple[int, ...]) -> None:
        """A process entry per inference server: its command line and its stat."""
        for pid in pids:
            entry = self.root / str(pid)
            entry.mkdir(exist_ok=True)
            argv = [
                "tritonserver",
                "--model-repository=/models",
                f"--load-model={SERVED_MODEL}",
                "--allow-metrics=false",
            ]
            (entry / "cmdline").write_bytes("\0".join(argv).encode() + b"\0")
            (entry / "stat").write_text(f"{pid} (tritonserver) S 1 {pid} 0 0\n")

    def _replace(self, name: str, text: str) -> None:
        tmp = self.root / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.root / name)


class WorkloadRunner:
    def __init__(
        self,
        db_path: Path,
        profile: WorkloadProfile,
        *,
        interval_s: float = 0.5,
        slowdown: float = 0.3,
        control: Path | None = None,
        seed: int | None = None,
        clock: Clock | None = None,
        proc_dir: Path | None = None,
        stall_after: float | None = None,
        jobs_dir: Path | None = None,
        job: JobInfo | None = None,
        cause: str | None = None,
        slow_after: float | None = None,
        late: float = 0.0,
    ) -> None:
        """``job``: the job file to keep in ``jobs_dir`` while running (default: the profile's
        job on this host). ``cause``: what ``slowdown`` comes from (None: the process sleeps);
        ``slow_after``: turn the slowdown on this many seconds after the start; ``late``: the
        most each interval's rows are written after it ends."""
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        if not 0 <= late < interval_s:
            raise ValueError("late must be >= 0 and shorter than the interval")
        for name, after in (("stall_after", stall_after), ("slow_after", slow_after)):
            if after is not None and after < 0:
                raise ValueError(f"{name} must be >= 0")
        if cause is not None and cause not in CAUSES:
            raise ValueError(f"cause must be one of {', '.join(CAUSES)}, got {cause!r}")
        if jobs_dir is not None and job is None:
            if profile.job_id is None:
                raise ValueError("a job file needs a job id")
            job = JobInfo(
                job_id=check_job_id(profile.job_id),
                cluster_id="default",
                node_id=socket.gethostname(),
                rank=profile.rank,
                world_size=None,
            )
        self.db_path = db_path
        self.generator = WorkloadGenerator(profile, seed)
        self.interval_s = interval_s
        self.slowdown_value = slowdown
        self.control = control
        self.clock = clock or SystemClock()
        self.toggled = False
        self.stop_event = SignalEvent()  # set by SIGTERM/SIGINT (install_signals)
        self.proc = SyntheticProc(proc_dir) if proc_dir is not None else None
        self.stall_after = stall_after
        self.slow_after = slow_after
        self.cause = cause
        self.jobs_dir = jobs_dir
        self.job = job
        self._stall_at: float | None = None
        self._slow_at: float | None = None
        self.late = late
        self._late_rng = random.Random(seed)
        # The control file's last ``for N`` request (its stamp) and its intervals still to run.
        self._request: tuple[Stamp, int] | None = None

    def toggle(self, _signum: int = 0, _frame: FrameType | None = None) -> None:
        self.toggled = not self.toggled
        why = f" ({self.cause})" if self.cause else ""
        log.info("slowdown %s", f"{self.slowdown_value:g}{why} on" if self.toggled else "off")

    def current(self) -> Control:
        """What this interval runs at: the control file's word, else the toggle and the stall."""
        return self._current(read_control(self.control) if self.control is not None else None)

    def _current(self, read: tuple[Control, Stamp] | None) -> Control:
        """:meth:`current` with the control file as read (None: absent or not valid)."""
        if read is not None:
            from_file, stamp = read
            if from_file.intervals is not None:
                from_file = self._counted(from_file, stamp)
            return replace(from_file, cause=from_file.cause or self.cause)
        stalled = self._stall_at is not None and self.clock.monotonic() >= self._stall_at
        return Control(self.slowdown_value if self.toggled else 0.0, stalled, self.cause)

    def _counted(self, control: Control, stamp: Stamp) -> Control:
        """A control for N intervals: this interval's share of it (full speed once spent).
        Counted here, not by whoever writes the file: however late they come to write the
        next word, exactly N intervals run so."""
        if self._request is None or self._request[0] != stamp:
            self._request = (stamp, control.intervals or 0)
        seen, left = self._request
        if left <= 0:
            return Control()
        self._request = (seen, left - 1)
        return control

    def current_slowdown(self) -> float:
        return self.current().slowdown

    def run(self, duration_s: float | None = None) -> int:
        """Write until stopped (or ``duration_s``); returns the number of intervals written."""
        db = connect(self.db_path)
        ticks = 0
        profile = self.generator.profile
        if self.stall_after is not None:
            self._stall_at = self.clock.monotonic() + self.stall_after
        if self.slow_after is not None:
            self._slow_at = self.clock.monotonic() + self.slow_after
        if self.jobs_dir is not None and self.job is not None:
            write_job(self.jobs_dir, replace(self.job, started_at=self.clock.now()))
        if self.proc is not None:
            self.proc.servers(profile.server_pids)
        stalled = False
        try:
            last = self.clock.now()
            replace_process(
                db,
                {
                    "pid": profile.pid,
                    "comm": "ingero-workload",
                    "exe": "synthetic",
                    "job_id": profile.job_id,
                    "rank": profile.rank,
                    "first_seen": last,
                    "last_seen": last,
                },
            )
            deadline = None if duration_s is None else time.monotonic() + duration_s
            next_tick = time.monotonic() + self.interval_s
            while not self.stop_event.is_set():
                if self.stop_event.wait(max(0.0, next_tick - time.monotonic())):
                    break
                # From now, not from a schedule: short intervals catching up after a late
                # one are not what a tracer writes, and fleet-push's window (a push interval
                # long) measures each of them together with the late one before it.
                next_tick = time.monotonic() + self.interval_s
                # The control file is read before the interval's end is taken: an interval
                # that runs slowed ends after whoever wrote the file noted the time it did
                # (`ingero demo` compares the rows from then on with as long before).
                read = read_control(self.control) if self.control is not None else None
                now = self.clock.now()
                if self._slow_at is not None and self.clock.monotonic() >= self._slow_at:
                    self._slow_at = None
                    self.toggle()  # once, as a SIGUSR1 would; a SIGUSR1 turns it off again
                control = self._current(read)
                if control.stalled != stalled:
                    stalled = control.stalled
                    log.info("%s", "stalled: no work, the job goes on" if stalled else "running")
                rows = self.generator.tick(
                    last, now, control.slowdown, control.stalled, control.cause
                )
                if self.proc is not None:
                    self.proc.write(now - last, rows.cpu_busy, rows.mem_available)
                last = now
                if self.late and self.stop_event.wait(self._late_rng.uniform(0, self.late)):
                    break
                write_tick(db, tick_batch(rows), now, ticks)
                ticks += 1
                if deadline is not None and time.monotonic() >= deadline:
                    break
        finally:
            db.conn.close()
            if self.jobs_dir is not None and self.job is not None:
                remove_job(self.jobs_dir, self.job.job_id)
        return ticks

    def install_signals(self) -> None:
        signal.signal(signal.SIGUSR1, self.toggle)
        StopSignals(self.stop_event).install()
