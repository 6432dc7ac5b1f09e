"""Per-job files the Slurm prolog writes and node agents read: ``/run/ingero/jobs/<job>.json``.

A file is written whole to a temporary name and renamed into place, so a reader sees the
old file, the new file or none, never half of one. Only the standard library is imported:
the prolog must start fast.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ingero.runtime.atomicfile import write_atomic

JOBS_DIR = Path("/run/ingero/jobs")
JOBS_DIR_ENV = "INGERO_JOBS_DIR"
FORMAT_VERSION = 1
_JOB_ID_RE = re.compile(r"^[0-9]{1,20}$")


def jobs_dir(environ: dict[str, str] | None = None) -> Path:
    """The directory of job files: ``$INGERO_JOBS_DIR`` or ``/run/ingero/jobs``."""
    env = os.environ if environ is None else environ
    return Path(env.get(JOBS_DIR_ENV) or JOBS_DIR)


def check_job_id(job_id: str) -> str:
    """A Slurm job id is numeric; anything else could name a path outside the directory."""
    if not isinstance(job_id, str) or not _JOB_ID_RE.match(job_id):
        raise ValueError(f"invalid Slurm job id {job_id!r} (expected digits)")
    return job_id


@dataclass(frozen=True)
class JobInfo:
    """What ingero knows about one job on this node; ``rank`` is the node's index in ``nodes``."""

    job_id: str
    cluster_id: str
    node_id: str
    rank: int | None
    world_size: int | None
    nodes: list[str] = field(default_factory=list)
    user: str | None = None
    uid: int | None = None
    partition: str | None = None
    gpus: list[str] = field(default_factory=list)
    started_at: float | None = None
    version: int = FORMAT_VERSION

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        # fleet-push looks for the node name under this key too.
        data["node_name"] = self.node_id
        return data

    @classmethod
    def from_dict(cls, data: object) -> JobInfo:
        """Parse a job file's JSON; ValueError names the bad field."""
        if not isinstance(data, dict):
            raise ValueError("a job file must hold a JSON object")
        out: dict[str, Any] = {}
        for key in ("job_id", "cluster_id", "node_id"):
            value = data.get(key)
            if not isinstance(value, str) or not value:
                raise ValueError(f"job file field {key} must be a non-empty string")
            out[key] = value
        check_job_id(out["job_id"])
        for key in ("rank", "world_size", "uid"):
            value = data.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"job file field {key} must be an integer")
            out[key] = value
        for key in ("nodes", "gpus"):
            value = data.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"job file field {key} must be a list of strings")
            out[key] = value
        for key in ("user", "partition"):
            value = data.get(key)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"job file field {key} must be a string")
            out[key] = value
        started = data.get("started_at")
        if started is not None and (
            isinstance(started, bool) or not isinstance(started, int | float)
        ):
            raise ValueError("job file field started_at must be a number")
        out["started_at"] = None if started is None else float(started)
        return cls(**out)


def job_path(directory: Path, job_id: str) -> Path:
    return directory / f"{check_job_id(job_id)}.json"


def write_job(directory: Path, info: JobInfo) -> Path:
    """Write ``info`` atomically (temp file + rename), world-readable; returns the path."""
    path = job_path(directory, info.job_id)
    _make_dirs(directory)
    # World-readable: task prologs and fleet-push run as other users. /run is tmpfs and the
    # file lives as long as the job, so the prolog skips the fsyncs (it must stay fast).
    payload = json.dumps(info.to_dict(), separators=(",", ":")).encode()
    write_atomic(path, payload, mode=0o644, durable=False)
    return path


def _make_dirs(directory: Path) -> None:
    """Create missing directories world-readable whatever the umask: task prologs and
    fleet-push run as other users. Existing directories are left as the admin made them."""
    missing = []
    path = directory
    while not path.exists():
        missing.append(path)
        path = path.parent
    for path in reversed(missing):
        try:
            path.mkdir()
        except FileExistsError:
            continue
        os.chmod(path, 0o755)


def read_job(directory: Path, job_id: str) -> JobInfo | None:
    """The job's file, or None when there is none; ValueError when it is corrupt."""
    try:
        text = job_path(directory, job_id).read_text()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"job file for job {job_id} is not JSON: {exc}") from None
    return JobInfo.from_dict(data)


def remove_job(directory: Path, job_id: str) -> bool:
    """Delete the job's file; False when there was none."""
    try:
        job_path(directory, job_id).unlink()
    except FileNotFoundError:
        return False
    return True


def current_jobs(directory: Path) -> list[JobInfo]:
    """Every readable job file in the directory (corrupt ones are left out), newest first."""
    found: list[tuple[float, JobInfo]] = []
    try:
        entries = list(directory.glob("*.json"))
    except OSError:
        return []
    for path in entries:
        try:
            info = JobInfo.from_dict(json.loads(path.read_text()))
            found.append((path.stat().st_mtime, info))
        except (OSError, ValueError):
            continue
    return [info for _, info in sorted(found, key=lambda item: item[0], reverse=True)]
