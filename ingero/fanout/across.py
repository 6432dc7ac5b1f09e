"""``ingero explain --nodes``: each node's own explain, and what only shows across nodes.

Each node explains itself (``ingero explain --json`` there). Across nodes this adds the one
cause a single node cannot see: which rank reaches the collectives of a communicator last
(peer lag), from every node's sampled NCCL calls (``nccl_calls`` where a node's DB has it,
v3, and its NCCL ``raw_events``), joined per communicator by sequence number where the
tracer numbered them (``join_collectives``). Pure: takes the
nodes' JSON answers and rows, returns plain values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ingero.explain.chains import CollectiveCall, Signal, Timeline, peer_lag_signal
from ingero.fanout.ssh import MergedRows
from ingero.nodedb.nccl import NCCL_CALL_COLUMNS, NCCL_COLUMNS


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
