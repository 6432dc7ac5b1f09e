"""Slurm through its command-line tools: ``ScontrolBackend`` and the parsers of their output.

It works on every Slurm version: it reads nodes with ``sinfo --json`` (22.05 to 23.11) and
falls back to ``scontrol show node --oneliner`` when JSON output is not available or, from
24.05 on, groups nodes; it changes nodes with ``scontrol update``. Jobs' accounting records
come from ``sacct`` and their AdminComment is set with ``sacctmgr modify job`` (slurmctld
refuses to update a finished job). One process per command, each with a timeout
(``ingero.slurm.backend.run_command``).
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from typing import Any

from ingero.slurm.backend import (
    DEFAULT_TIMEOUT,
    JobRecord,
    NodeInfo,
    Runner,
    SlurmError,
    check_admin_comment,
    check_node_name,
    check_reason,
    node_from_state,
    run_command,
)
from ingero.slurm.jobfile import check_job_id


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


_CLUSTER_NAME_RE = re.compile(r"^ClusterName\s*=\s*(\S+)\s*$", re.MULTILINE)


def parse_cluster_name(text: str) -> str:
    """ClusterName from ``scontrol show config``."""
    match = _CLUSTER_NAME_RE.search(text)
    if not match or match[1] == "(null)":
        raise SlurmError("scontrol show config: no ClusterName")
    return match[1]


# The fields sacct prints per job, AdminComment last: it is the one that may hold "|".
SACCT_FIELDS = "JobIDRaw,State,Start,End,NNodes,AdminComment"
# Every state of a job that is over (sacct -s): completed, cancelled, failed, timeout, node
# fail, out of memory, preempted, deadline, boot fail.
ENDED_STATES = "CD,CA,F,TO,NF,OOM,PR,DL,BF"
_VERSION = re.compile(r"\b(\d+)\.(\d+)")


def _sacct_time(text: str) -> float | None:
    """sacct's local time (``2026-12-06T19:43:11``); None for ``Unknown``/``None``."""
    try:
        return datetime.fromisoformat(text.strip()).timestamp()  # naive: local, as sacct
    except ValueError:
        return None


def parse_sacct(text: str) -> list[JobRecord]:
    """Jobs from ``sacct -X -n -P -o {SACCT_FIELDS}``, one per line."""
    jobs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", 5)
        if len(parts) != 6 or not parts[0]:
            raise SlurmError(f"sacct: unexpected line {line[:60]!r}")
        job_id, state, start, end, nodes, comment = parts
        jobs.append(
            JobRecord(
                job_id=job_id,
                # "CANCELLED by 0": the base state is the first word
                state=(state.split() or ["UNKNOWN"])[0].upper(),
                start=_sacct_time(start),
                end=_sacct_time(end),
                nodes=int(nodes) if nodes.isdigit() else None,
                admin_comment=comment or None,
            )
        )
    return jobs


def _local(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


class ScontrolBackend:
    """Slurm through its command-line tools (``SLURM_CONF`` in the environment picks the cluster)."""

    name = "scontrol"

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, runner: Runner = run_command) -> None:
        self._timeout = timeout
        self._run = runner
        self._json: bool | None = None  # unknown until the first read
        self._cluster: str | None = None
        self._lowercased: bool | None = None

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

    # -- accounting ---------------------------------------------------------------------

    @property
    def admin_comment_lowercased(self) -> bool:
        # sacctmgr lowercased AdminComment, Comment and SystemComment before 23.02.
        if self._lowercased is None:
            version = _VERSION.search(self._run(["sacctmgr", "--version"], self._timeout))
            if version is None:
                raise SlurmError("sacctmgr --version: no version number")
            self._lowercased = (int(version[1]), int(version[2])) < (23, 2)
        return self._lowercased

    def job_record(self, job_id: str) -> JobRecord | None:
        check_job_id(job_id)
        text = self._run(
            ["sacct", "-X", "-n", "-P", "-j", job_id, "-o", SACCT_FIELDS], self._timeout
        )
        # A requeued job has a record per run: the last is the one that counts.
        records = [r for r in parse_sacct(text) if r.job_id == job_id]
        return records[-1] if records else None

    def ended_jobs(self, since: float, until: float) -> list[JobRecord]:
        text = self._run(
            ["sacct", "-X", "-n", "-P", "-a", "-S", _local(since), "-E", _local(until),
             "-s", ENDED_STATES, "-o", SACCT_FIELDS],
            self._timeout,
        )  # fmt: skip
        return [r for r in parse_sacct(text) if r.ended]

    def set_admin_comment(self, job_id: str, text: str) -> None:
        check_job_id(job_id)
        check_admin_comment(text)
        self._run(
            ["sacctmgr", "-i", "modify", "job", "where", f"jobid={job_id}", "set",
             f"AdminComment={text}"],
            self._timeout,
        )  # fmt: skip
