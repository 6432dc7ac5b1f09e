"""Slurm job id and rank of each traced process.

The process environment (``SLURM_JOB_ID``, ``SLURM_PROCID``) is authoritative; the
prolog's job file (/run/ingero/jobs/<job>.json) confirms the job and supplies the node's
rank when the process carries no SLURM_PROCID. Processes outside Slurm get no tags.
"""

from __future__ import annotations

from pathlib import Path

from ingero.slurm.jobfile import jobs_dir, read_job
from ingero.trace.aggregate import Tags
from ingero.trace.procmaps import DEFAULT_PROC


def parse_environ(data: bytes) -> dict[str, str]:
    """``/proc/PID/environ`` (NUL-separated KEY=VALUE) as a dict; malformed entries skipped."""
    env: dict[str, str] = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def tags_from_environ(env: dict[str, str], job_dir: Path | None = None) -> Tags:
    job_id = env.get("SLURM_JOB_ID", "").strip() or None
    if job_id is not None and not job_id.isdigit():
        job_id = None
    rank: int | None = None
    procid = env.get("SLURM_PROCID", "").strip()
    if procid.isdigit():
        rank = int(procid)
    if job_id is not None and rank is None and job_dir is not None:
        try:
            info = read_job(job_dir, job_id)
        except (OSError, ValueError):
            info = None
        if info is not None:
            rank = info.rank
    return Tags(job_id, rank)


class TagCache:
    """Tags per pid, read once per process (its environment does not change)."""

    def __init__(self, proc: Path = DEFAULT_PROC, job_dir: Path | None = None) -> None:
        self._proc = proc
        self._job_dir = job_dir if job_dir is not None else jobs_dir()
        self._tags: dict[int, Tags] = {}

    def get(self, pid: int) -> Tags:
        tags = self._tags.get(pid)
        if tags is None:
            try:
                data = (self._proc / str(pid) / "environ").read_bytes()
            except OSError:
                return Tags()
            tags = tags_from_environ(parse_environ(data), self._job_dir)
            self._tags[pid] = tags
        return tags

    def forget(self, pid: int) -> None:
        self._tags.pop(pid, None)

    def snapshot(self) -> dict[int, Tags]:
        return dict(self._tags)
