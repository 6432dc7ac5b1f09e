"""How ingero reads node states and drains/resumes nodes: a small typed interface over Slurm.

``ScontrolBackend`` works on every Slurm version: it reads nodes with ``sinfo --json``
(22.05 to 23.11) and falls back to ``scontrol show node --oneliner`` when JSON output is
not available or, from 24.05 on, groups nodes; it changes nodes with ``scontrol update``. Every command runs with a timeout:
with slurmctld down a Slurm command retries for many seconds before it gives up.
``PyslurmBackend`` (ingero.slurm.pyslurm_backend) keeps the same contract through Slurm's
own library; :func:`make_backend` picks one.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from ingero.runtime.errors import ConfigError, UnavailableError

log = logging.getLogger(__name__)

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


def parse_sinfo_json(text: str) -> list[NodeInfo]:
    """Nodes from ``sinfo --json`` (openapi v0.0.38 of Slurm 22.05 and later versions)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SlurmError(f"sinfo --json: not JSON: {exc}") from None
    if isinstance(data, dict) and "sinfo" in data and "nodes" not in data:
        # 24.05 and later print node groups, and one group shows one reason for nodes whose
        # reasons differ (25.11 lists n2 and n3 under n2's): per-node reasons need scontrol.
        raise SlurmError("sinfo --json: grouped output (Slurm 24.05+), no per-node reasons")
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise SlurmError("sinfo --json: no 'nodes' list in the output")
    # With slurmctld unresponsive, sinfo --json exits 0 with an empty list and errors inside.
    errors = data.get("errors")
    if errors:
        first = errors[0] if isinstance(errors, list) else errors
        detail = first.get("error", first) if isinstance(first, dict) else first
        raise SlurmError(f"sinfo --json: Slurm reported an error: {detail}")
    if not data["nodes"]:
        raise SlurmError("sinfo --json: no nodes listed")
    nodes = []
    for item in data["nodes"]:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise SlurmError("sinfo --json: a node entry has no name")
        state, flags = _json_state(item)
        reason = item.get("reason") or None
        changed = item.get("reason_changed_at")
        if isinstance(changed, dict):  # newer versions: {"set": true, "number": N}
            changed = changed.get("number")
        nodes.append(
            NodeInfo(
                name=item["name"],
                state=state,
                flags=flags,
                reason=reason if isinstance(reason, str) else None,
                reason_user=item.get("reason_set_by_user") or None,
                reason_time=float(changed)
                if isinstance(changed, int | float) and changed
                else None,
            )
        )
    return nodes


def _json_state(item: dict[str, Any]) -> tuple[str, frozenset[str]]:
    raw = item.get("state")
    flags = {str(f).upper() for f in item.get("state_flags") or []}
    # 22.05: "state": "idle" + "state_flags": [...]; 23.02+: "state": ["IDLE", "DRAIN"].
    if isinstance(raw, list):
        parts = [str(p).upper() for p in raw]
        base = parts[0].lower() if parts else "unknown"
        flags |= set(parts[1:])
    elif isinstance(raw, str):
        base = raw.lower()
    else:
        raise SlurmError(f"sinfo --json: node {item.get('name')} has no state")
    return base, frozenset(flags)


_REASON_RE = re.compile(
    r"(?:^|\s)Reason=(?P<reason>.*?)(?:\s\[(?P<user>[^@\]]*)@(?P<time>[^\]]*)\])?\s*$"
)
_STATE_RE = re.compile(r"(?:^|\s)State=(?P<state>\S+)")
_NAME_RE = re.compile(r"^NodeName=(?P<name>\S+)")


def parse_scontrol_nodes(text: str) -> list[NodeInfo]:
    """Nodes from ``scontrol show node --oneliner`` (one line per node).

    ``Reason=`` comes last and may hold spaces and ``=`` (ingero's own reason does), so it is
    matched from its key to the ``[user@time]`` suffix rather than split on spaces.
    """
    nodes = []
    for line in text.splitlines():
        if not line.strip():
            continue
        name_match = _NAME_RE.match(line)
        if not name_match:
            raise SlurmError(f"scontrol show node: unexpected line {line[:60]!r}")
        head, _, _ = line.partition(" Reason=")
        state_match = _STATE_RE.search(head)
        if not state_match:
            raise SlurmError(f"scontrol show node: node {name_match['name']} has no State=")
        reason_match = _REASON_RE.search(line[len(head) :]) if " Reason=" in line else None
        reason_time = None
        if reason_match and reason_match["time"]:
            try:
                stamp = datetime.fromisoformat(reason_match["time"])
                reason_time = stamp.replace(tzinfo=stamp.tzinfo or UTC).timestamp()
            except ValueError:
                reason_time = None
        nodes.append(
            node_from_state(
                name_match["name"],
                state_match["state"],
                reason=reason_match["reason"] if reason_match else None,
                reason_user=(reason_match["user"] or None) if reason_match else None,
                reason_time=reason_time,
            )
        )
    return nodes


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


_CLUSTER_NAME_RE = re.compile(r"^ClusterName\s*=\s*(\S+)\s*$", re.MULTILINE)


def parse_cluster_name(text: str) -> str:
    """ClusterName from ``scontrol show config``."""
    match = _CLUSTER_NAME_RE.search(text)
    if not match or match[1] == "(null)":
        raise SlurmError("scontrol show config: no ClusterName")
    return match[1]


class ScontrolBackend:
    """Slurm through its command-line tools (``SLURM_CONF`` in the environment picks the cluster)."""

    name = "scontrol"

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, runner: Runner = run_command) -> None:
        self._timeout = timeout
        self._run = runner
        self._json: bool | None = None  # unknown until the first read
        self._cluster: str | None = None

    def cluster_name(self) -> str:
        if self._cluster is None:  # fixed for the life of slurmctld: read once
            text = self._run(["scontrol", "show", "config"], self._timeout)
            self._cluster = parse_cluster_name(text)
        return self._cluster

    def nodes(self) -> list[NodeInfo]:
        if self._json is not False:
            try:
                nodes = parse_sinfo_json(self._run(["sinfo", "--json"], self._timeout))
                self._json = True
                return nodes
            except SlurmError:
                # Once JSON worked, a failure is Slurm's trouble, not a missing feature.
                if self._json:
                    raise
        nodes = parse_scontrol_nodes(
            self._run(["scontrol", "show", "node", "--oneliner"], self._timeout)
        )
        # scontrol works where sinfo --json did not: JSON output is missing here.
        self._json = False
        return nodes

    def drain(self, node: str, reason: str) -> None:
        check_node_name(node)
        check_reason(reason)
        self._run(
            ["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"],
            self._timeout,
        )

    def resume(self, node: str) -> None:
        check_node_name(node)
        self._run(["scontrol", "update", f"nodename={node}", "state=resume"], self._timeout)


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


def make_backend(kind: str = "auto", timeout: float = DEFAULT_TIMEOUT) -> SlurmBackend:
    """The backend ``drain.backend`` names (docs/slurm.md "Backends").

    ``pyslurm`` needs pyslurm importable by this interpreter; whether it loads and matches
    this host's Slurm shows on its first call (a SlurmError the caller retries), so a
    daemon starts either way. ``auto`` starts pyslurm's worker once, here: pyslurm when it
    loads and is built for the Slurm release ``scontrol --version`` reports (or no scontrol
    is installed), else scontrol.
    """
    if kind not in ("auto", "scontrol", "pyslurm"):
        raise ConfigError(f"drain.backend: unknown backend {kind!r}")
    if kind != "scontrol":
        from ingero.slurm.pyslurm_backend import PyslurmBackend, pyslurm_installed

        if pyslurm_installed():
            backend = PyslurmBackend(
                timeout=timeout, site_version=lambda: installed_slurm_version(timeout)
            )
            if kind == "pyslurm":
                return backend
            try:
                backend.start()
                return backend
            except SlurmError as exc:
                log.info("Slurm backend auto: not pyslurm (%s); scontrol", exc)
        elif kind == "pyslurm":
            raise UnavailableError(
                f"pyslurm is not installed for {sys.executable} "
                "(pip install the pyslurm release matching this Slurm; docs/slurm.md)"
            )
    if shutil.which("scontrol") is None:
        raise UnavailableError("scontrol not found in PATH (install slurm-client)")
    return ScontrolBackend(timeout=timeout)
