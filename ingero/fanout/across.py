"""``ingero explain --nodes``: each node's own explain, and what only shows across nodes.

Each node explains itself (``ingero explain --json`` there). Across nodes this adds the one
cause a single node cannot see: which rank reaches the collectives of a communicator last
(peer lag), from every node's sampled NCCL calls (``nccl_calls`` where a node's DB has it,
v3, and its NCCL ``raw_events``), joined per communicator by sequence number where the
tracer numbered them (``join_collectives``). :func:`explain_nodes` runs both rounds over
SSH; the rest is pure: it takes the nodes' JSON answers and rows, returns plain values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ingero.explain.chains import CollectiveCall, Signal, Timeline, peer_lag_signal
from ingero.fanout.ssh import Fanout, MergedRows, merge_query_results, remote_json, run_on_nodes
from ingero.nodedb.nccl import NCCL_CALL_COLUMNS, NCCL_COLUMNS, nccl_calls_sql, nccl_sql
from ingero.nodedb.sidefile import describe


@dataclass(frozen=True)
class Across:
    """What the nodes answered: each one's ``explain --json``, those that gave none (with
    why), and the rank lagging behind its peers across them, where one does."""

    reports: dict[str, dict[str, Any]]
    failed: list[dict[str, Any]]
    peer: Signal | None

    def as_json(self) -> dict[str, Any]:
        across = {"peer_lag": signal_dict(self.peer)}
        return {"nodes": self.reports, "failed": self.failed, "across": across}

    def lines(self) -> list[str]:
        """One line per node (its top chain, its fix, its stack snapshot), then the peer."""
        out = []
        for node, report in self.reports.items():
            out.append(top_line(node, report))
            chains = report.get("chains") or []
            if chains:
                out.append(f"   fix: {chains[0]['fix']}")
            stacks = report.get("stack_snapshot")
            if isinstance(stacks, dict):
                out.append(f"   stack: {describe(stacks)}")
        if self.peer is not None:
            out.append(f"across nodes: {self.peer.text}")
        return out


def explain_nodes(spread: Fanout, args: list[str]) -> Across:
    """The ingero command ``args`` (``explain --json ...``) on every node, then, over the
    window their answers cover, every answering node's NCCL calls, aligned across them."""
    options = spread.options
    results = run_on_nodes(spread.nodes, [options.remote_ingero, *args], options)
    reports: dict[str, dict[str, Any]] = {}
    failed = []
    for r in results:
        report = remote_json(r) if r.ok else None
        if report is None:
            failure = r.as_failure(options.node_timeout_s)
            if r.ok:
                failure["error"] = "answered something other than ingero explain --json output"
            failed.append(failure)
        else:
            reports[r.node] = report
    peer = None
    window = recent_window(reports)
    if window is not None:
        # The second round reads every node's NCCL calls of the recent window (unbounded
        # by --limit only up to the query's own cap) to align the collectives across nodes.
        db = ["--db", args[args.index("--db") + 1]] if "--db" in args else []

        def nodes_query(sql: str) -> MergedRows:
            argv = [options.remote_ingero, "query", "--json", "--limit", "100000", *db, sql]
            return merge_query_results(run_on_nodes(list(reports), argv, options),
                                       options.node_timeout_s)  # fmt: skip

        # nccl_calls (node DB v3) joins collectives by sequence number; a node whose DB
        # predates it refuses that query and is aligned from its raw events alone.
        rows = nodes_query(nccl_sql(*window))
        peer = cross_node_peer_lag(rows, *window, numbered=nodes_query(nccl_calls_sql(*window)))
    return Across(reports, failed, peer)


def recent_window(reports: Mapping[str, Mapping[str, Any]]) -> tuple[float, float] | None:
    """The span the nodes' recent windows cover together, or None when none has one."""
    spans = [
        (float(r["recent"]["start"]), float(r["recent"]["end"]))
        for r in reports.values()
        if isinstance(r.get("recent"), dict) and not r.get("empty")
    ]
    if not spans:
        return None
    return min(a for a, _ in spans), max(b for _, b in spans)


def cross_node_peer_lag(
    rows: MergedRows, start: float, end: float, numbered: MergedRows | None = None
) -> Signal | None:
    """The rank (and node) that reaches a communicator's collectives last, from all nodes.

    ``rows``: the nodes' NCCL raw events (``ingero.nodedb.nccl.nccl_sql``); ``numbered``:
    their ``nccl_calls`` (``nccl_calls_sql``; nodes whose DB predates it simply have none).
    """
    from ingero.explain.reader import collective, numbered_collective, sampled_collectives

    index = {c: i for i, c in enumerate(rows.columns)}
    if any(c not in index for c in ("node", *NCCL_COLUMNS)):
        return None
    raw: list[CollectiveCall] = []
    for row in rows.rows:
        ts, dur, pid, rank, op, detail = (row[index[c]] for c in NCCL_COLUMNS)
        call = collective(ts, dur, pid, rank, op, detail, node=str(row[index["node"]]))
        if call is not None:
            raw.append(call)
    calls: list[CollectiveCall] = []
    if numbered is not None and set(NCCL_CALL_COLUMNS) <= set(numbered.columns):
        for values in numbered.rows:
            named = dict(zip(numbered.columns, values, strict=True))
            if (call := numbered_collective(named, node=str(named["node"]))) is not None:
                calls.append(call)
    collectives = tuple(sampled_collectives(calls, raw))
    return peer_lag_signal(Timeline(start, start, end, collectives=collectives))


def top_line(node: str, report: Mapping[str, Any]) -> str:
    """One line per node: its most likely chain, or that nothing stands out."""
    chains = report.get("chains") or []
    summary = report.get("summary") or {}
    # A job replaying CUDA graphs: its work is its graph launches (kernel launches may be 0).
    kind = "graph" if summary.get("graph_launch_rate") is not None else "kernel"
    rate = summary.get(f"{kind}_launch_rate")
    launches = f" ({kind} launches {rate:,.0f}/s)" if isinstance(rate, int | float) else ""
    if report.get("empty"):
        return f"{node}: nothing recorded in the window"
    if not chains:
        return f"{node}: no causal chain{launches}"
    top = chains[0]
    return f"{node}: {top['name']} ({top['level']}, {top['confidence']:.2f}): {top['headline']}"


def signal_dict(sig: Signal | None) -> dict[str, Any] | None:
    if sig is None:
        return None
    return {"signal": sig.id, "text": sig.text, "evidence": sig.evidence, "onset": sig.onset}
