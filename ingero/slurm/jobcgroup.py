"""Which Slurm jobs still run on this node, from the cgroups slurmstepd keeps for them.

A job's cgroup outlives the job where slurmstepd could not remove it (it crashed, a process
would not die): a reader that takes the GPUs a cgroup names for a running job's keeps
billing an ended one. Here a job cgroup counts as running only while it holds processes:

- cgroup v2 (Slurm's ``cgroup/v2`` plugin): ``<root>/system.slice/<scope>/job_<id>/``,
  where ``<scope>`` is ``slurmstepd.scope`` (``<node>_slurmstepd.scope`` with several
  slurmds on one host); its ``cgroup.events`` says ``populated 1`` while any process is in
  it or below.
- cgroup v1 (``cgroup/v1``): ``<root>/<controller>/slurm[_<node>]/uid_<uid>/job_<id>/``
  (freezer first, as proctrack/cgroup uses it); running while a ``cgroup.procs`` in it or
  in a step below lists a process.

``job_cgroups`` returns None where Slurm keeps no job cgroups here (task/none,
proctrack/linuxproc): then the job files alone say which jobs run. Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Final

CGROUP_ROOT: Final = Path("/sys/fs/cgroup")
_JOB = re.compile(r"^job_([0-9]{1,20})$")
# cgroup v1 controllers slurmstepd creates its hierarchy under, the freezer first.
_V1_CONTROLLERS: Final = ("freezer", "cpuset", "memory", "devices", "cpu,cpuacct", "pids")
MAX_JOBS: Final = 4096  # job directories read per call, at most


def _populated_v2(job: Path) -> bool:
    try:
        text = (job / "cgroup.events").read_text()
    except OSError:
        return False
    return any(line.split() == ["populated", "1"] for line in text.splitlines())


def _populated_v1(job: Path, depth: int = 3) -> bool:
    try:
        if (job / "cgroup.procs").read_text().strip():
            return True
        children = [c for c in job.iterdir() if c.is_dir()] if depth > 0 else []
    except OSError:
        return False
    return any(_populated_v1(child, depth - 1) for child in children)


def _jobs(bases: list[Path], populated: Callable[[Path], bool]) -> dict[str, bool]:
    found: dict[str, bool] = {}
    for base in bases:
        try:
            entries = sorted(base.iterdir())
        except OSError:
            continue
        for entry in entries[:MAX_JOBS]:
            m = _JOB.match(entry.name)
            if m is None or not entry.is_dir():
                continue
            alive = populated(entry)
            found[m.group(1)] = found.get(m.group(1), False) or alive
    return found


def job_cgroups(root: Path = CGROUP_ROOT) -> dict[str, bool] | None:
    """Job id -> whether its cgroup holds processes; None: no Slurm job cgroups here."""
    scopes = sorted((root / "system.slice").glob("*slurmstepd.scope"))
    if scopes:
        return _jobs(scopes, _populated_v2)
    for controller in _V1_CONTROLLERS:
        users = sorted(p for s in (root / controller).glob("slurm*") for p in s.glob("uid_*"))
        if users:
            return _jobs(users, _populated_v1)
    return None
