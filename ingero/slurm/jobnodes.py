"""The nodes a Slurm job runs on, for ``--job`` of the fan-out commands (query, explain, …).

The job's NodeList (a hostlist such as ``gpu[01-04]``) comes from ``squeue -h -j J -o %N``,
or from ``scontrol show job J`` where squeue is not installed; ``scontrol show hostnames``
expands it the way Slurm itself does. Every command runs through ``backend.run_command``
(with its timeout), so a test swaps the runner for captured outputs. With pyslurm
(:func:`make_job_nodes`), libslurm answers both in one worker call. Either way the list is
in node-rank order: a node's index is its ``SLURM_NODEID`` in the job.
"""

from __future__ import annotations

import re
import shutil
from typing import Protocol

from ingero.slurm.backend import DEFAULT_TIMEOUT, Runner, SlurmError, run_command
from ingero.slurm.factory import make_backend
from ingero.slurm.pyslurm_backend import PyslurmBackend

_JOB_ID = re.compile(r"^[0-9]+(_[0-9]+)?(\+[0-9]+)?$")  # 123, array 123_4, het 123+1
_NODELIST = re.compile(r"(?:^|\s)NodeList=(\S+)")


class JobNodes(Protocol):
    name: str

    def nodes(self, job_id: str) -> list[str]:
        """The job's nodes in node-rank order; raises SlurmError."""
        ...


def check_job_id(job_id: str) -> None:
    if not _JOB_ID.match(job_id):
        raise SlurmError(f"--job: not a Slurm job id: {job_id!r}")


def parse_squeue_nodelist(text: str) -> str | None:
    """The NodeList ``squeue -h -j J -o %N`` printed; None for a job with no nodes yet."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else None


def parse_job_nodelist(text: str) -> str | None:
    """``NodeList=`` of ``scontrol show job J`` (not ReqNodeList/ExcNodeList); None if unset."""
    match = _NODELIST.search(text)
    if match is None or match[1] in ("(null)", "None", ""):
        return None
    return match[1]


def parse_hostnames(text: str) -> list[str]:
    """``scontrol show hostnames LIST``: one node name per line."""
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


class SlurmJobNodes:
    """Reads a job's nodes with squeue (or scontrol) and scontrol show hostnames."""

    name = "scontrol"

    def __init__(
        self,
        runner: Runner = run_command,
        timeout: float = DEFAULT_TIMEOUT,
        have_squeue: bool | None = None,
    ) -> None:
        self._run = runner
        self._timeout = timeout
        self._squeue = shutil.which("squeue") is not None if have_squeue is None else have_squeue

    def nodes(self, job_id: str) -> list[str]:
        check_job_id(job_id)
        if self._squeue:
            nodelist = parse_squeue_nodelist(
                self._run(["squeue", "-h", "-j", job_id, "-o", "%N"], self._timeout)
            )
        else:
            nodelist = parse_job_nodelist(
                self._run(["scontrol", "show", "job", job_id], self._timeout)
            )
        if nodelist is None:
            raise SlurmError(f"job {job_id} has no nodes (yet): is it still pending?")
        nodes = parse_hostnames(
            self._run(["scontrol", "show", "hostnames", nodelist], self._timeout)
        )
        if not nodes:
            raise SlurmError(f"scontrol show hostnames {nodelist}: no node names")
        return nodes


class PyslurmJobNodes:
    """A job's nodes through pyslurm's worker (one call, no process per lookup)."""

    name = "pyslurm"

    def __init__(self, backend: PyslurmBackend) -> None:
        self.backend = backend

    def nodes(self, job_id: str) -> list[str]:
        check_job_id(job_id)
        return self.backend.job_nodes(job_id)


def make_job_nodes(kind: str = "auto", timeout: float = DEFAULT_TIMEOUT) -> JobNodes:
    """Job lookups through the backend ``make_backend`` picks for ``kind``."""
    backend = make_backend(kind, timeout)
    if isinstance(backend, PyslurmBackend):
        return PyslurmJobNodes(backend)
    return SlurmJobNodes(timeout=timeout)
