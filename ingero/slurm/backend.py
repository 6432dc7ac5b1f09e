"""The Slurm backend contract: a small typed interface over Slurm, and what its two
implementations share.

A backend reads node states and drains/resumes nodes (:class:`SlurmBackend`), every call
with a timeout: with slurmctld down a Slurm command or RPC retries for many seconds before
it gives up. ``ScontrolBackend`` (:mod:`ingero.slurm.scontrol_backend`) works through
Slurm's command-line tools on every version, ``PyslurmBackend``
(:mod:`ingero.slurm.pyslurm_backend`) through Slurm's own library;
:func:`ingero.slurm.factory.make_backend` picks one. Neither imports the other, nor the
factory: this module is all they share.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ingero.runtime.errors import UnavailableError

INGERO_REASON_PREFIX = "ingero:"
DEFAULT_TIMEOUT = 10.0

# Runs a command (argv, timeout seconds) and returns its stdout; raises SlurmError on failure.
Runner = Callable[[Sequence[str], float], str]


class SlurmError(UnavailableError):
    """A Slurm command failed, timed out or printed something we cannot parse."""


@dataclass(frozen=True)
class NodeInfo:
    """One Slurm node: base state (lower case), state flags (upper case) and its reason."""

    name: str
    state: str
    flags: frozenset[str] = frozenset()
    reason: str | None = None
    reason_user: str | None = None
    reason_time: float | None = None

    @property
    def down(self) -> bool:
        return self.state == "down" or "NOT_RESPONDING" in self.flags

    @property
    def drained(self) -> bool:
        """Draining or drained (the DRAIN flag is set)."""
        return "DRAIN" in self.flags or self.state in ("drained", "draining", "drain")

    @property
    def reboot_pending(self) -> bool:
        return any(f.startswith("REBOOT") for f in self.flags) or self.state == "reboot"

    @property
    def stale_ingero_reason(self) -> bool:
        """ingero's reason left on a node back in service: Slurm 25.11 keeps the last reason
        after ``state=resume`` (22.05 clears it), and it claims nothing any more. Someone
        else's reason on such a node still counts: it may be a note meant to keep ingero away.
        """
        return str(self.reason or "").startswith(INGERO_REASON_PREFIX) and not (
            self.drained or self.down or self.reboot_pending or "FAIL" in self.flags
        )

    @property
    def held_reason(self) -> str | None:
        """The reason, unless it is ingero's stale one."""
        return None if self.stale_ingero_reason else self.reason

    @property
    def ingero_reason(self) -> bool:
        """The node's reason was written by ingero (so ingero may resume the node)."""
        return str(self.held_reason or "").startswith(INGERO_REASON_PREFIX)


class SlurmBackend(Protocol):
    name: str

    def nodes(self) -> list[NodeInfo]:
        """Every node of the cluster; raises SlurmError."""
        ...

    def cluster_name(self) -> str:
        """The cluster's ClusterName (Fleet's ``cluster_id`` of its nodes); raises SlurmError."""
        ...

    def drain(self, node: str, reason: str) -> None:
        """Drain ``node`` with ``reason``; raises SlurmError."""
        ...

    def resume(self, node: str) -> None:
        """Return ``node`` to service; raises SlurmError."""
        ...


# Job states of a job that runs or may run again: its accounting record is not final.
_NOT_ENDED = frozenset(
    {"PENDING", "RUNNING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING"}
)


@dataclass(frozen=True)
class JobRecord:
    """A job as Slurm's accounting (slurmdbd) holds it: ``state`` its base state in upper
    case (``COMPLETED``, ``FAILED``, ``CANCELLED``, ``RUNNING``, ...), ``start``/``end`` Unix
    seconds (None: not yet), ``nodes`` its node count, ``admin_comment`` its AdminComment."""

    job_id: str
    state: str
    start: float | None = None
    end: float | None = None
    nodes: int | None = None
    admin_comment: str | None = None

    @property
    def ended(self) -> bool:
        """The job is over and its record final (it has an end and will not run again)."""
        return self.end is not None and self.state not in _NOT_ENDED


class AccountingBackend(SlurmBackend, Protocol):
    """A backend that also reads and annotates jobs in Slurm's accounting, where the job's
    verdict is kept (``AdminComment``: docs/slurm.md, "The job's verdict in sacct")."""

    @property
    def admin_comment_lowercased(self) -> bool:
        """Whether an AdminComment set through this backend is stored in lower case
        (sacctmgr before Slurm 23.02 lowercases it); raises SlurmError."""
        ...

    def job_record(self, job_id: str) -> JobRecord | None:
        """The job's accounting record; None where accounting has none; raises SlurmError."""
        ...

    def ended_jobs(self, since: float, until: float) -> list[JobRecord]:
        """The jobs of this cluster that ended between ``since`` and ``until`` (Unix s), by
        their accounting records; raises SlurmError."""
        ...

    def set_admin_comment(self, job_id: str, text: str) -> None:
        """Set the job's AdminComment to ``text`` in accounting (the job has ended: Slurm
        refuses to update a finished job through slurmctld); raises SlurmError."""
        ...


def check_admin_comment(text: str) -> None:
    # One line: sacct prints one row per job; quotes: sacctmgr strips the text at one.
    if "\n" in text or "\r" in text or '"' in text or "'" in text:
        raise ValueError("an AdminComment must be one line without quotes")


def run_command(args: Sequence[str], timeout: float) -> str:
    """Run a Slurm command; SlurmError with its stderr when it fails or times out."""
    try:
        proc = subprocess.run(
            list(args), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(args[:3])}: no answer within {timeout:g}s") from None
    except OSError as exc:
        raise SlurmError(f"{args[0]}: cannot run: {exc.strerror or exc}") from None
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise SlurmError(
            f"{' '.join(args[:3])}: exit {proc.returncode}: {detail[-1] if detail else 'no output'}"
        )
    return proc.stdout


def node_from_state(
    name: str,
    state: str,
    reason: str | None = None,
    reason_user: str | None = None,
    reason_time: float | None = None,
) -> NodeInfo:
    """A node from Slurm's whole state string, as ``scontrol show node`` and libslurm's
    ``slurm_node_state_string_complete`` write it: ``IDLE+DRAIN``, ``DOWN*+REBOOT_ISSUED``."""
    parts = state.split("+")
    return NodeInfo(
        name=name,
        state=parts[0].rstrip("*~#!%$@^-").lower(),
        flags=frozenset(p.upper() for p in parts[1:]),
        reason=reason,
        reason_user=reason_user,
        reason_time=reason_time,
    )


def check_node_name(node: str) -> None:
    # A hostlist expression ("n[1-9]") or a comma would change many nodes at once.
    if not node or any(c in node for c in "[],= \t\n"):
        raise ValueError(f"invalid node name {node!r}: one node name expected")


def check_reason(reason: str) -> None:
    if not reason or "\n" in reason:
        raise ValueError("a drain reason must be one non-empty line")


def installed_slurm_version(timeout: float = DEFAULT_TIMEOUT) -> str | None:
    """This host's Slurm release as ``scontrol --version`` prints it ("slurm 25.11.7");
    None without scontrol or when it cannot say."""
    if shutil.which("scontrol") is None:
        return None
    try:
        return run_command(["scontrol", "--version"], timeout).strip() or None
    except SlurmError:
        return None
