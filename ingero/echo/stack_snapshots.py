"""Stack snapshots in Echo's answers: where the rank everyone waits for is in its code.

A node sends ``stack_snapshot`` under the id of the episode it belongs to (a
``collective_hang`` that waited for one of its ranks, a ``peer_lag``, or its own stall's
``straggler_state``; docs/fleet-push.md, "Stack snapshots"). Echo stores it as any event
(its size is bounded by the OTLP record limit) and joins it here, by ``event_id``, to the
hung collectives of ``collective_lag`` and ``job_report``: the stacks of the ranks that
never entered the collective are the answer, one line of it; those of the ranks waiting
inside it, where a node of theirs sent one, are context.

An event's extra fields are what a sender put there: anything of the wrong shape is left
out of the answer, never a reason to fail it. Standard library only; pure but for
:func:`read`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ingero.schema.events import snapshot_line
from ingero.schema.stacks import StackError, stack_from_json

TYPE = "stack_snapshot"
HANG = "collective_hang"
MISSING = "missing"  # a rank the collective waits for: the answer
WAITING = "waiting"  # a rank inside the collective, or a rank of no hang: context


def read(
    conn: sqlite3.Connection,
    where: str,
    params: Sequence[Any],
    window: tuple[float, float],
    limit: int,
) -> list[dict[str, Any]]:
    """The snapshots ``where`` selects (the caller's job and scope) within ``window``,
    newest first, as :func:`view` gives them."""
    rows = conn.execute(
        "SELECT event_id, cluster_id, node_id, job_id, rank, ts, extra FROM events"
        f" WHERE type = ? AND {where} AND ts >= ? AND ts <= ? ORDER BY ts DESC LIMIT ?",
        [TYPE, *params, window[0], window[1], limit],
    )
    return [view(*row) for row in rows]


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _entry(raw: Any) -> dict[str, Any] | None:
    """One process/thread of a snapshot, with its one-line ``summary``; None when it is
    not an entry the node writes."""
    if not isinstance(raw, Mapping):
        return None
    try:
        stack = stack_from_json(raw)
    except StackError:
        return None
    thread = raw.get("thread")
    return {
        "pid": _int(raw.get("pid")),
        "rank": _int(raw.get("rank")),
        "thread": thread if isinstance(thread, str) else None,
        "summary": stack.summary(),
        **stack.to_json(),
    }


def view(
    event_id: str,
    cluster_id: str,
    node_id: str,
    job_id: str | None,
    rank: int | None,
    ts: float,
    extra: str | None,
) -> dict[str, Any]:
    """A stored snapshot event as the answers show it."""
    try:
        fields = json.loads(extra) if extra else {}
    except ValueError:
        fields = {}
    if not isinstance(fields, dict):
        fields = {}
    raw = fields.get("stacks")
    stacks = [e for e in (_entry(r) for r in raw) if e is not None] if isinstance(raw, list) else []
    trigger = fields.get("trigger")
    return {
        "event_id": event_id,
        "cluster_id": cluster_id,
        "node_id": node_id,
        "job_id": job_id,
        "rank": rank,
        "timestamp": ts,
        "trigger": trigger if isinstance(trigger, str) else None,
        "for_s": _num(fields.get("for_s")),
        "stacks": stacks,
    }


def _answer_entry(snapshot: Mapping[str, Any], ranks: set[int]) -> dict[str, Any] | None:
    """The entry of a missing rank's node that answers: a missing rank's own thread with
    Python frames, else the node's first (the node puts its most telling thread first)."""
    entries: list[dict[str, Any]] = snapshot["stacks"]
    own = [e for e in entries if e["rank"] in ranks]
    for e in own or entries:
        if e["frames"]:
            return e
    chosen = own or entries
    return chosen[0] if chosen else None


def explain_hang(hang: Mapping[str, Any], snapshots: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The hang's snapshots (same ``event_id``), each thread marked ``missing`` (a rank
    it waits for, or on a node of one) or ``waiting``, and the answer in one line: "the
    job is hung in ncclAllReduce #9001; rank 5 on gpu07 has been in read_batch at
    loader.py:212 ← __next__ at loader.py:18 for 45 s" (None without a snapshot of a
    missing rank's node)."""
    ranks = {r for r in hang.get("missing_ranks") or () if isinstance(r, int)}
    nodes = set(hang.get("missing_nodes") or ())
    mine = [s for s in snapshots if s["event_id"] == hang["event_id"]]
    stacks: list[dict[str, Any]] = []
    answer = None
    for snap in sorted(mine, key=lambda s: (s["node_id"] not in nodes, s["node_id"])):
        # A node sends a snapshot under a hang's id only when Fleet named it as a missing
        # rank's, so its own word counts where the hang named no node (the rank had not
        # reported when the hang began).
        on_missing_node = snap["node_id"] in nodes or snap["trigger"] == HANG
        # A missing rank's node: its ranks among the missing are the answer; where none of
        # its ranks is known to be (ranks untagged), every one of its threads is.
        matched = any(e["rank"] in ranks for e in snap["stacks"])
        for e in snap["stacks"]:
            missing = on_missing_node and (e["rank"] in ranks or not matched)
            stacks.append(
                {"node_id": snap["node_id"], "role": MISSING if missing else WAITING, **e}
            )
        best = _answer_entry(snap, ranks) if on_missing_node else None
        if answer is None and best is not None:
            rank = best["rank"] if best["rank"] is not None else snap["rank"]
            answer = snapshot_line(
                HANG, hang.get("op"), hang.get("seq"), rank, snap["node_id"],
                best["summary"], snap["for_s"],
            )  # fmt: skip
    return {"answer": answer, "stacks": stacks}
