"""Who wrote a mark: the Slurm job and rank its rows carry, from what the writer cannot forge.

SO_PEERCRED gives the writer's pid and uid (the kernel's word). Its job comes from its cgroup:
slurmstepd puts every task of a job in the job's cgroup, made by root where no user can make
one, ``/system.slice/[<node>_]slurmstepd.scope/job_<id>/…`` on cgroup v2 and
``/slurm[_<node>]/uid_<uid>/job_<id>/…`` on cgroup v1, and a process cannot move itself
into another job's. The path must start there: a user may create cgroups named ``job_<id>``
under the subtree systemd delegates to them (``/user.slice/…``), never at those roots. The
prolog's job file (``/run/ingero/jobs/<id>.json``, root's) then confirms that the job belongs
to the writer's uid; a job whose file names another uid is not the writer's, and its marks
carry no job.

The rank is the writer's own ``SLURM_PROCID`` where its environment names that same job (a
writer can only mislabel its own job's ranks, which its user owns anyway), else the node's
rank from the job file. The environment (``SLURM_JOB_ID``, which any process sets for
itself) is believed alone only for the server's own user and root: the socket's owner and
the one user who could write the node DB directly anyway. Every other writer outside a Slurm
job cgroup marks with no job and no rank, keeping its pid and uid.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from ingero.annotate.server import Writer
from ingero.runtime.procstat import stat_fields
from ingero.slurm.jobfile import JobInfo, jobs_dir, read_job
from ingero.trace.procmaps import DEFAULT_PROC
from ingero.trace.tags import parse_environ, tags_from_environ

_V2 = re.compile(r"^/system\.slice/(?:[^/]+_)?slurmstepd\.scope/job_([0-9]{1,20})(?:/|$)")
_V1 = re.compile(r"^/slurm(?:_[^/]+)?/uid_([0-9]+)/job_([0-9]{1,20})(?:/|$)")


def slurm_job(cgroup: str, uid: int) -> str | None:
    """The Slurm job of a process from its ``/proc/PID/cgroup`` text; None outside one (or
    where its hierarchies disagree, or a v1 path names another uid)."""
    found: set[str] = set()
    for line in cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        path = parts[2]
        if m := _V2.match(path):
            found.add(m.group(1))
        elif (m := _V1.match(path)) and int(m.group(1)) == uid:
            found.add(m.group(2))
    return found.pop() if len(found) == 1 else None


def process_start(base: Path) -> int | None:
    """The process's start time, clock ticks after boot (field 22 of ``/proc/PID/stat``);
    None where it cannot be read. The command name (field 2) may hold spaces and
    parentheses: the fields are counted from its last ``)``."""
    fields = stat_fields(base / "stat") or []
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None


@dataclass(frozen=True)
class Identify:
    """``identify(pid, uid)`` for ``ingero.annotate.server.serve`` (the rule above)."""

    proc: Path = DEFAULT_PROC
    jobs: Path = field(default_factory=jobs_dir)
    # The server's own user and root: their processes' environment is believed.
    trusted: frozenset[int] = field(default_factory=lambda: frozenset({0, os.geteuid()}))

    def __call__(self, pid: int, uid: int) -> Writer:
        return replace(self._writer(pid, uid), started=process_start(self.proc / str(pid)))

    def _writer(self, pid: int, uid: int) -> Writer:
        base = self.proc / str(pid)
        try:
            job = slurm_job((base / "cgroup").read_text(), uid)
        except (OSError, UnicodeDecodeError):
            job = None
        if job is None:
            if uid not in self.trusted:
                return Writer(pid, uid)
            tags = tags_from_environ(self._environ(base), self.jobs)
            return Writer(pid, uid, tags.job_id, tags.rank)
        try:
            info: JobInfo | None = read_job(self.jobs, job)
        except (OSError, ValueError):
            info = None
        if info is not None and info.uid is not None and info.uid != uid:
            return Writer(pid, uid)  # the job file says the job is another user's
        rank = None
        env = self._environ(base)
        if env.get("SLURM_JOB_ID", "").strip() == job:
            rank = tags_from_environ(env).rank
        if rank is None and info is not None:
            rank = info.rank
        return Writer(pid, uid, job, rank)

    @staticmethod
    def _environ(base: Path) -> dict[str, str]:
        # Readable by root, or by a server of the writer's own user; else no rank from it.
        try:
            return parse_environ((base / "environ").read_bytes())
        except OSError:
            return {}
