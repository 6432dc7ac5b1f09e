"""Run an ``ingero`` command on many nodes over SSH, in parallel, with ClusterShell.

ClusterShell is the HPC field's own fan-out library (clush): its ``NodeSet`` reads the
hostlist syntax admins already use (``gpu[01-64]``, ``gpu[01-04,07]``, ``a1,b[2-3]``), and
its task engine runs one ``ssh`` per node with at most ``fanout`` at a time, a per-node
command timeout and ssh's own options. A node that cannot be reached, times out or fails is
reported with why, never fatal: the caller merges what the other nodes answered.
"""

from __future__ import annotations

import json
import math
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from ingero.runtime.errors import EXIT_DATAERR, EXIT_UNAVAILABLE, IngeroError, UsageError

DEFAULT_FANOUT: Final = 64  # as clush: ssh processes running at once
DEFAULT_NODE_TIMEOUT_S: Final = 60.0
DEFAULT_CONNECT_TIMEOUT_S: Final = 10
DEFAULT_REMOTE_INGERO: Final = "ingero"
# ssh exits 255 for its own errors (connection refused, host key, authentication).
SSH_ERROR: Final = 255
COMMAND_NOT_FOUND: Final = 127
# clock_offsets: the node prints its time this many times, this far apart (s), about 0.2 s
# in all, so that a short stall of this host or the node's ssh cannot delay every sample.
CLOCK_SAMPLES: Final = 10
CLOCK_SAMPLE_GAP_S: Final = 0.02
# What clock_offsets runs on each node (a list, not seq: busybox nodes have no seq).
CLOCK_ARGV: Final = (
    "sh",
    "-c",
    f"for i in {' '.join(str(i) for i in range(CLOCK_SAMPLES))};"
    f" do date +%s.%N; sleep {CLOCK_SAMPLE_GAP_S}; done",
)


@dataclass(frozen=True)
class FanoutOptions:
    fanout: int = DEFAULT_FANOUT
    node_timeout_s: float = DEFAULT_NODE_TIMEOUT_S
    connect_timeout_s: int = DEFAULT_CONNECT_TIMEOUT_S
    ssh_options: str | None = None  # e.g. "-F ~/.ssh/ingero_config -p 2222 -i ~/.ssh/id"
    ssh_user: str | None = None
    remote_ingero: str = DEFAULT_REMOTE_INGERO


@dataclass(frozen=True)
class Fanout:
    """The nodes to run on, and how."""

    nodes: list[str]
    options: FanoutOptions


@dataclass(frozen=True)
class NodeResult:
    """What one node answered; ``rc`` is None when it timed out."""

    node: str
    rc: int | None
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.rc == 0

    @property
    def reachable(self) -> bool:
        return self.rc is not None and self.rc != SSH_ERROR

    def error(self, timeout_s: float) -> str:
        """One line: why this node gave no answer."""
        last = next((ln.strip() for ln in reversed(self.stderr.splitlines()) if ln.strip()), "")
        if self.rc is None:
            return f"timed out after {timeout_s:g}s"
        if self.rc == SSH_ERROR:
            return f"unreachable: {last or 'ssh failed'}"
        if self.rc == COMMAND_NOT_FOUND:
            return f"ingero not found on the node (set --remote-ingero): {last}"
        return last.removeprefix("ingero: ") or f"exit status {self.rc}"

    def as_failure(self, timeout_s: float) -> dict[str, Any]:
        return {"node": self.node, "exit": self.rc, "error": self.error(timeout_s)}


def expand_nodes(spec: str) -> list[str]:
    """Node names of a ClusterShell node set (``gpu[01-64]``); UsageError when malformed."""
    from ClusterShell.NodeSet import NodeSet, NodeSetException

    try:
        nodes = list(NodeSet(spec))
    except NodeSetException as exc:
        raise UsageError(f"--nodes: not a node set: {spec!r} ({exc})") from None
    if not nodes:
        raise UsageError("--nodes: no nodes given")
    return nodes


def run_on_nodes(
    nodes: Sequence[str],
    argv: Sequence[str],
    options: FanoutOptions,
    arrivals: dict[str, list[tuple[float, bytes]]] | None = None,
) -> list[NodeResult]:
    """Run ``argv`` (quoted for the remote shell) on every node; one result per node, in order.

    ``arrivals``, when given, receives each node's stdout lines with the local time each
    arrived.
    """
    from ClusterShell.Event import EventHandler
    from ClusterShell.NodeSet import NodeSet
    from ClusterShell.Task import task_cleanup, task_self

    class Lines(EventHandler):  # type: ignore[misc]
        def ev_read(self, worker: Any, node: str, sname: str, msg: bytes) -> None:
            if arrivals is not None and sname == "stdout":
                arrivals.setdefault(str(node), []).append((time.time(), bytes(msg)))

    task = task_self()
    try:
        task.set_info("fanout", max(1, options.fanout))
        task.set_info("connect_timeout", options.connect_timeout_s)
        task.set_info("ssh_options", options.ssh_options)
        task.set_info("ssh_user", options.ssh_user)
        worker = task.shell(
            shlex.join(argv),
            nodes=NodeSet.fromlist(nodes),
            timeout=options.node_timeout_s,
            handler=Lines(),
            stderr=True,
            stdin=False,
        )
        task.resume()
        out = {
            str(n): bytes(b).decode(errors="replace") for b, ns in worker.iter_buffers() for n in ns
        }
        err = {
            str(n): bytes(b).decode(errors="replace") for b, ns in worker.iter_errors() for n in ns
        }
        rcs = {str(n): int(rc) for rc, ns in worker.iter_retcodes() for n in ns}
        timed_out = {str(n) for n in worker.iter_keys_timeout()}
    finally:
        task_cleanup()
    return [
        NodeResult(
            node=n,
            rc=None if n in timed_out else rcs.get(n),
            stdout=out.get(n, ""),
            stderr=err.get(n, ""),
        )
        for n in nodes
    ]


def remote_json(result: NodeResult) -> dict[str, Any] | None:
    """The JSON object a node's ``ingero ... --json`` printed, or None when it is not one."""
    try:
        value = json.loads(result.stdout)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class NoNodeAnswered(IngeroError):
    """Every node failed: exit 65 when their ingero refused (a bad query), else 69."""


def no_node_answered(failures: Sequence[NodeResult | dict[str, Any]]) -> NoNodeAnswered:
    """The error for a fan-out where no node answered (results or their ``as_failure``)."""
    codes = [f.rc if isinstance(f, NodeResult) else f.get("exit") for f in failures]
    refused = any(c not in (None, SSH_ERROR, COMMAND_NOT_FOUND) for c in codes)
    error = NoNodeAnswered(f"no node answered ({len(failures)} failed)")
    error.exit_code = EXIT_DATAERR if refused else EXIT_UNAVAILABLE
    return error


@dataclass
class MergedRows:
    """Rows of one query from many nodes, each with a leading ``node`` column."""

    columns: list[str]
    rows: list[list[Any]]
    ok: list[str]
    failed: list[dict[str, Any]]
    truncated: list[str]  # nodes that stopped at --limit


def merge_query_results(results: Sequence[NodeResult], timeout_s: float) -> MergedRows:
    """Merge ``ingero query --json`` answers; columns in first-seen order, missing ones NULL."""
    columns: list[str] = []
    answers: list[tuple[str, list[str], list[list[Any]]]] = []
    merged = MergedRows(["node"], [], [], [], [])
    for r in results:
        value = remote_json(r) if r.ok else None
        cols, rows = (value or {}).get("columns"), (value or {}).get("rows")
        if not r.ok or not isinstance(cols, list) or not isinstance(rows, list):
            failure = r.as_failure(timeout_s)
            if r.ok:
                failure["error"] = "answered something other than ingero query --json output"
            merged.failed.append(failure)
            continue
        merged.ok.append(r.node)
        if (value or {}).get("truncated"):
            merged.truncated.append(r.node)
        names = [str(c) for c in cols]
        columns += [c for c in names if c not in columns]
        answers.append((r.node, names, rows))
    merged.columns += columns
    for node, names, rows in answers:
        where = [names.index(c) if c in names else None for c in columns]
        for row in rows:
            merged.rows.append([node, *(None if i is None else row[i] for i in where)])
    return merged


def clock_offsets(nodes: Sequence[str], options: FanoutOptions) -> dict[str, float]:
    """Each reachable node's clock minus this host's, in seconds.

    The node prints its time CLOCK_SAMPLES times, CLOCK_SAMPLE_GAP_S apart, and each line
    arrives here some delay later; :func:`least_delayed_offset` keeps the sample that took
    the least. One sample is not enough: on a loaded host a line can wait here (or in the
    ssh client) for hundreds of milliseconds before it is read, past the 100 ms at which
    ``ingero export`` warns that clocks disagree, where the least delayed of several waits
    about one network delay (milliseconds).
    """
    arrivals: dict[str, list[tuple[float, bytes]]] = {}
    results = run_on_nodes(nodes, CLOCK_ARGV, options, arrivals)
    offsets = {}
    for r in results:
        if not r.ok:
            continue
        offset = least_delayed_offset(arrivals.get(r.node, []))
        if offset is not None:
            offsets[r.node] = offset
    return offsets


def least_delayed_offset(samples: Sequence[tuple[float, bytes]]) -> float | None:
    """The node's clock offset from (local arrival time, the node's time it printed) lines:
    the largest ``node time - arrival``; None when no line is a time.

    A line arrives after it was printed, so each difference is the true offset less that
    line's delay; the largest is the one delayed least, the nearest to the truth.
    """
    best: float | None = None
    for arrived, line in samples:
        try:
            remote = float(line.strip())
        except ValueError:
            continue
        if not math.isfinite(remote):
            continue
        offset = remote - arrived
        if best is None or offset > best:
            best = offset
    return best
