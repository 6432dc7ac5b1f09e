"""NCCL collective episodes in Echo: ``peer_lag`` and ``collective_hang`` events folded
into one row per episode as they are stored, and the folds the ``collective_lag``
question makes of those rows (ranks ranked by lag, hung collectives, skewed clocks).

Fleet gives every event of one episode (its ``state: start`` re-emits and its
``state: end``) one ``event_id``, so an episode is identified by (``event_id``, ``type``,
``cluster_id``: a sender of one cluster can never fold into another's episode) and folds with one upsert, whatever order its events arrive in: the time span widens,
the worst lag only grows, ``end_ts`` is set by an end event, and the other figures (lag,
how often last, missing ranks, node) are those of the newest ``start`` event, all of them
from that one event (an older one arriving late replaces none). The end event's figures
count only while no start event has come: they say how the episode ended (a rank back in
step, a hang gone), while the question asks how late a rank was, and who never arrived.
The store folds only events it did not have, so a retried batch never counts twice.

An event's extra fields are what a sender put there: a field of the wrong type is read as
missing (the event itself is kept as it came), never as a reason to fail the commit, which
a sender would retry for ever. Pure and standard library only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any, NamedTuple

from ingero.echo.rows import CLUSTER_ID, EVENT_ID, EXTRA, JOB_ID, NODE_ID, RANK, TS, TYPE, EventRow

LAG = "peer_lag"
HANG = "collective_hang"
SKEW = "clock_skew"
TYPES = frozenset({LAG, HANG})
END = "end"  # an episode's closing event has extra state "end" (the others "start")

# The columns of ``collective_episodes`` an event fills, in the order ``episode_row`` gives.
COLUMNS = (
    "event_id",
    "type",
    "cluster_id",
    "node_id",
    "job_id",
    "rank",
    "comm_hash",
    "comm_rank",
    "nranks",
    "op",
    "seq",
    "start_ts",
    "last_ts",
    "end_ts",
    "figures_ts",
    "figures_end",
    "n_events",
    "lag_p50_ms",
    "lag_p95_ms",
    "max_lag_p50_ms",
    "max_lag_p95_ms",
    "collectives",
    "last_count",
    "bytes",
    "missing_ranks",
    "missing_nodes",
    "inside_ranks",
    "inside_for_s",
    "since_ts",
    "reason",
)
# Columns the upsert folds its own way; every other one is a figure the episode takes from
# the newest of its events that ranks highest (start events before end events): all from
# one event, so the fold is the same in every order.
_FOLDED = frozenset(
    {
        "event_id",
        "type",
        "cluster_id",
        "job_id",
        "start_ts",
        "last_ts",
        "end_ts",
        "n_events",
        "max_lag_p50_ms",
        "max_lag_p95_ms",
        "since_ts",
    }
)
_LATEST = tuple(c for c in COLUMNS if c not in _FOLDED)


_NEWER = (
    "excluded.figures_end < figures_end"
    " OR (excluded.figures_end = figures_end AND excluded.figures_ts > figures_ts)"
)


def _newest(column: str) -> str:
    return f"{column} = CASE WHEN {_NEWER} THEN excluded.{column} ELSE {column} END"


# SET expressions read the row as it was before the update, so their order does not matter.
UPSERT = (
    f"INSERT INTO collective_episodes ({', '.join(COLUMNS)})"
    f" VALUES ({','.join('?' * len(COLUMNS))})"
    " ON CONFLICT (event_id, type, cluster_id) DO UPDATE SET "
    + ", ".join(
        [
            *(_newest(c) for c in _LATEST),
            "start_ts = min(start_ts, excluded.start_ts)",
            "last_ts = max(last_ts, excluded.last_ts)",
            "end_ts = CASE WHEN excluded.end_ts IS NULL THEN end_ts"
            " ELSE max(coalesce(end_ts, excluded.end_ts), excluded.end_ts) END",
            "n_events = n_events + 1",
            "max_lag_p50_ms = max(coalesce(max_lag_p50_ms, excluded.max_lag_p50_ms),"
            " coalesce(excluded.max_lag_p50_ms, max_lag_p50_ms))",
            "max_lag_p95_ms = max(coalesce(max_lag_p95_ms, excluded.max_lag_p95_ms),"
            " coalesce(excluded.max_lag_p95_ms, max_lag_p95_ms))",
            "since_ts = min(coalesce(since_ts, excluded.since_ts),"
            " coalesce(excluded.since_ts, since_ts))",
        ]
    )
)


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


def _num(value: Any) -> float | None:
    if type(value) is float and math.isfinite(value):
        return value
    return float(value) if type(value) is int else None


def _str(value: Any) -> str | None:
    return value if type(value) is str and value else None


def _ints(value: Any) -> str | None:
    """A list of integers (missing ranks) as the JSON text stored; None if it is not one."""
    if isinstance(value, list) and all(type(v) is int for v in value):
        return json.dumps(value, separators=(",", ":"))
    return None


def _strs(value: Any) -> str | None:
    if isinstance(value, list) and all(type(v) is str for v in value):
        return json.dumps(value, separators=(",", ":"))
    return None


def episode_row(row: EventRow) -> tuple[Any, ...]:
    """The ``collective_episodes`` values (``COLUMNS``) one stored event folds in as."""
    ts = row[TS]
    extra = json.loads(row[EXTRA]) if row[EXTRA] else {}
    if not isinstance(extra, dict):
        extra = {}
    ended = extra.get("state") == END
    p50, p95 = _num(extra.get("lag_p50_ms")), _num(extra.get("lag_p95_ms"))
    inside = _num(extra.get("inside_for_s"))
    return (
        row[EVENT_ID],
        row[TYPE],
        row[CLUSTER_ID],
        row[NODE_ID],
        row[JOB_ID] or "",
        row[RANK],
        _str(extra.get("comm_hash")),
        _int(extra.get("comm_rank")),
        _int(extra.get("nranks")),
        _str(extra.get("op")),
        _int(extra.get("seq")),
        ts,
        ts,
        ts if ended else None,
        ts,
        int(ended),
        1,
        p50,
        p95,
        p50,
        p95,
        _int(extra.get("collectives")),
        _int(extra.get("last_count")),
        _int(extra.get("bytes")),
        _ints(extra.get("missing_ranks")),
        _strs(extra.get("missing_nodes")),
        _int(extra.get("inside_ranks")),
        inside,
        # when the ranks went in: the hang was seen after they had been inside that long
        ts - inside if inside is not None and row[TYPE] == HANG else None,
        _str(extra.get("reason")),
    )


# -- what the question makes of the rows ------------------------------------------------------


class LagEpisode(NamedTuple):
    """One ``peer_lag`` episode as the question reads it (``LAG_FIELDS`` of the table)."""

    cluster_id: str
    comm_hash: str | None
    comm_rank: int | None
    rank: int | None
    node_id: str
    nranks: int | None
    op: str | None
    lag_p50_ms: float | None
    lag_p95_ms: float | None
    max_lag_p50_ms: float | None
    max_lag_p95_ms: float | None
    collectives: int | None
    last_count: int | None
    bytes: int | None
    start_ts: float
    last_ts: float
    end_ts: float | None


LAG_FIELDS = ", ".join(LagEpisode._fields)


def _max(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def rank_lag(episodes: Iterable[LagEpisode]) -> list[dict[str, Any]]:
    """Ranks of a job ranked by lag: one entry per (cluster, communicator, comm rank) with
    the figures of its newest episode (lag now, how often last, on which node), its worst
    lag, and its episodes open and closed. Worst p50 lag first, then the most often last."""
    ranks: dict[tuple[str, str | None, int | None], dict[str, Any]] = {}
    newest: dict[tuple[str, str | None, int | None], float] = {}
    for ep in episodes:
        key = (ep.cluster_id, ep.comm_hash, ep.comm_rank)
        r = ranks.get(key)
        if r is None:
            r = ranks[key] = {
                "cluster_id": ep.cluster_id,
                "comm_hash": ep.comm_hash,
                "comm_rank": ep.comm_rank,
                "max_lag_p50_ms": None,
                "max_lag_p95_ms": None,
                "episodes": 0,
                "open_episodes": 0,
                "closed_episodes": 0,
                "first_seen": ep.start_ts,
                "last_seen": ep.last_ts,
            }
        if ep.last_ts >= newest.get(key, -math.inf):
            newest[key] = ep.last_ts
            r.update(
                rank=ep.rank,
                node_id=ep.node_id,
                nranks=ep.nranks,
                op=ep.op,
                lag_p50_ms=ep.lag_p50_ms,
                lag_p95_ms=ep.lag_p95_ms,
                times_last=ep.last_count,
                collectives=ep.collectives,
                bytes=ep.bytes,
            )
        r["max_lag_p50_ms"] = _max(r["max_lag_p50_ms"], ep.max_lag_p50_ms)
        r["max_lag_p95_ms"] = _max(r["max_lag_p95_ms"], ep.max_lag_p95_ms)
        r["episodes"] += 1
        r["open_episodes" if ep.end_ts is None else "closed_episodes"] += 1
        r["first_seen"] = min(r["first_seen"], ep.start_ts)
        r["last_seen"] = max(r["last_seen"], ep.last_ts)
    return sorted(
        ranks.values(),
        key=lambda r: (
            r["max_lag_p50_ms"] is None,
            -(r["max_lag_p50_ms"] or 0.0),
            -(r["times_last"] or 0),
            r["cluster_id"],
            r["comm_hash"] or "",
            -1 if r["comm_rank"] is None else r["comm_rank"],
        ),
    )


class HangEpisode(NamedTuple):
    """One ``collective_hang`` episode as the question reads it (``HANG_FIELDS``)."""

    cluster_id: str
    event_id: str
    node_id: str
    comm_hash: str | None
    seq: int | None
    op: str | None
    nranks: int | None
    reason: str | None
    missing_ranks: str | None  # JSON
    missing_nodes: str | None  # JSON
    inside_ranks: int | None
    inside_for_s: float | None
    since_ts: float | None
    start_ts: float
    last_ts: float
    end_ts: float | None


HANG_FIELDS = ", ".join(HangEpisode._fields)


def hangs(episodes: Iterable[HangEpisode]) -> list[dict[str, Any]]:
    """Hung collectives: those still open first, then the most recent."""
    out = [
        {
            "cluster_id": ep.cluster_id,
            "event_id": ep.event_id,
            "comm_hash": ep.comm_hash,
            "seq": ep.seq,
            "op": ep.op,
            "nranks": ep.nranks,
            "reason": ep.reason,
            "missing_ranks": json.loads(ep.missing_ranks) if ep.missing_ranks else [],
            "missing_nodes": json.loads(ep.missing_nodes) if ep.missing_nodes else [],
            "node_id": ep.node_id or None,
            "inside_ranks": ep.inside_ranks,
            "inside_for_s": ep.inside_for_s,
            "since": ep.since_ts if ep.since_ts is not None else ep.start_ts,
            "detected": ep.start_ts,
            "last_seen": ep.last_ts,
            "ended": ep.end_ts,
            "open": ep.end_ts is None,
        }
        for ep in episodes
    ]
    out.sort(key=lambda h: (not h["open"], -h["since"], h["comm_hash"] or "", h["seq"] or 0))
    return out


def clock_skew(events: Iterable[tuple[str, str, float, str | None]]) -> list[dict[str, Any]]:
    """Nodes whose clock was off Fleet's, from their ``clock_skew`` events (cluster, node,
    timestamp, extra JSON): the newest offset and bound, the largest offset, whether the
    newest event still reports it (not ``state: end``). Largest offset first."""
    nodes: dict[tuple[str, str], dict[str, Any]] = {}
    for cluster_id, node_id, ts, extra_json in events:
        extra = json.loads(extra_json) if extra_json else {}
        if not isinstance(extra, dict):
            extra = {}
        offset = _num(extra.get("offset_ms"))
        n = nodes.get((cluster_id, node_id))
        if n is None:
            n = nodes[(cluster_id, node_id)] = {
                "cluster_id": cluster_id,
                "node_id": node_id,
                "max_abs_offset_ms": None,
                "events": 0,
                "first_seen": ts,
                "last_seen": -math.inf,
            }
        if ts >= n["last_seen"]:
            n.update(
                offset_ms=offset,
                uncertainty_ms=_num(extra.get("uncertainty_ms")),
                bound_ms=_num(extra.get("bound_ms")),
                open=extra.get("state") != END,
                last_seen=ts,
            )
        if offset is not None:
            n["max_abs_offset_ms"] = _max(n["max_abs_offset_ms"], abs(offset))
        n["events"] += 1
        n["first_seen"] = min(n["first_seen"], ts)
    return sorted(
        nodes.values(),
        key=lambda n: (-(n["max_abs_offset_ms"] or 0.0), n["cluster_id"], n["node_id"]),
    )
