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
a sender would retry for ever. Standard library only; the questions' reads take a
connection and a WHERE fragment (the caller's scope), the rest is pure.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from ingero.echo.rows import (
    CLUSTER_ID,
    EVENT_ID,
    EXTRA,
    JOB_ID,
    NODE_ID,
    RANK,
    TS,
    TYPE,
    EventRow,
)
from ingero.echo.rows import COLUMNS as EVENT_COLUMNS

LAG = "peer_lag"
HANG = "collective_hang"
SKEW = "clock_skew"
TYPES = frozenset({LAG, HANG})
END = "end"  # an episode's closing event has extra state "end" (the others "start")
Window = tuple[float, float]  # since, until

# The columns of ``collective_episodes`` an event fills, in the order ``episode_row`` gives:
# the event's own first six (event_id, type, cluster_id, node_id, job_id, rank), then its
# NCCL figures and the fold's.
_EVENT_COLUMNS = EVENT_COLUMNS[: RANK + 1]
COLUMNS = (
    *_EVENT_COLUMNS,
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
    "end_reason",
    "missing_count",
    "late_count",
    "peers_wait_p50_ms",
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
        "end_reason",
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
            "end_reason = coalesce(excluded.end_reason, end_reason)",
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


def _count(count: Any, listed: Any) -> int | None:
    """A count of ranks: given as a number, else as many as are listed (a sender may name
    only the first few ranks and count them all), else a number where the list would be."""
    if type(count) is int:
        return count
    if isinstance(listed, list):
        return len(listed)
    return _int(listed)


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
    missing = _ints(extra.get("missing_ranks"))
    # when the ranks went in: a hang is seen after they had been inside that long, and its
    # end event may say (``since``); the earliest of what its events say
    went_in = [ts - inside] if inside is not None else []
    if _num(extra.get("since")) is not None:
        went_in.append(float(extra["since"]))
    reason = _str(extra.get("reason"))
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
        missing,
        _strs(extra.get("missing_nodes")),
        _count(extra.get("inside_count"), extra.get("inside_ranks")),
        inside,
        min(went_in) if went_in and row[TYPE] == HANG else None,
        None if ended else reason,  # why it is an episode; an end's reason is how it ended
        reason if ended else None,
        _count(extra.get("missing_count"), extra.get("missing_ranks")),
        _int(extra.get("late_count")),
        _num(extra.get("peers_wait_p50_ms")),
    )


# -- what the question makes of the rows ------------------------------------------------------


# One entry per (cluster, communicator, comm rank): the figures of its newest episode
# (SQLite gives a GROUP BY's bare columns from the row of its one max(): ``newest``), and
# over all of its episodes the worst lag, how many (open), first and last seen
# (``overall``), joined on the group key (a missing hash or rank grouped as one). In SQL
# and ranked there, so a job of many episodes is never folded in Python and LIMIT keeps
# the worst: 32,000 episodes of 64 ranks answered in ~0.25 s (a Python fold: ~0.5 s;
# window functions: ~1 s).
_KEY = "cluster_id, coalesce(comm_hash, '') AS k_hash, coalesce(comm_rank, -1) AS k_rank"
_RANKS_SQL = (
    "SELECT overall.cluster_id, comm_hash, comm_rank, rank, node_id, nranks, op,"
    " lag_p50_ms, lag_p95_ms, worst_p50, worst_p95, last_count, late_count, collectives,"
    " peers_wait_p50_ms, bytes, n, n_open, first_seen, last_seen"
    f" FROM (SELECT {_KEY}, max(max_lag_p50_ms) AS worst_p50, max(max_lag_p95_ms) AS worst_p95,"
    " count(*) AS n, sum(end_ts IS NULL) AS n_open, min(start_ts) AS first_seen"
    " FROM collective_episodes WHERE type = ? AND {where} GROUP BY 1, 2, 3) AS overall"
    f" JOIN (SELECT {_KEY}, max(last_ts) AS last_seen, comm_hash, comm_rank, rank, node_id,"
    " nranks, op, lag_p50_ms, lag_p95_ms, last_count, late_count, collectives,"
    " peers_wait_p50_ms, bytes"
    " FROM collective_episodes WHERE type = ? AND {where} GROUP BY 1, 2, 3) AS newest"
    " USING (cluster_id, k_hash, k_rank)"
    " ORDER BY worst_p50 IS NULL, worst_p50 DESC, coalesce(last_count, 0) DESC,"
    " overall.cluster_id, k_hash, k_rank LIMIT ?"
)


def _window(where: str) -> str:
    return f"{where} AND start_ts <= ? AND coalesce(end_ts, last_ts) >= ?"


def rank_lag(
    conn: sqlite3.Connection, where: str, params: Sequence[Any], window: Window, limit: int
) -> list[dict[str, Any]]:
    """Ranks ranked by lag, over the ``peer_lag`` episodes that overlap ``window``
    (since, until) among those ``where`` (a condition on ``collective_episodes``, with
    ``params``) selects: worst p50 lag first, then the rank last most often (missing
    figures last), then by cluster, communicator and rank. The lag now, how often last,
    the node and the Slurm rank are those of the rank's newest episode."""
    sql = _RANKS_SQL.format(where=_window(where))
    selected = [LAG, *params, window[1], window[0]]
    return [
        {
            "cluster_id": c,
            "comm_hash": comm,
            "comm_rank": comm_rank,
            "rank": rank,
            "node_id": node,
            "nranks": nranks,
            "op": op,
            "lag_p50_ms": p50,
            "lag_p95_ms": p95,
            "max_lag_p50_ms": worst50,
            "max_lag_p95_ms": worst95,
            "times_last": last,
            "times_late": late,
            "collectives": counted,
            "peers_wait_p50_ms": wait,
            "bytes": size,
            "episodes": n,
            "open_episodes": n_open,
            "closed_episodes": n - n_open,
            "first_seen": first,
            "last_seen": seen,
        }
        for (
            c, comm, comm_rank, rank, node, nranks, op, p50, p95, worst50, worst95, last, late,
            counted, wait, size, n, n_open, first, seen,
        ) in conn.execute(sql, [*selected, *selected, limit])
    ]  # fmt: skip


_HANGS_SQL = (
    "SELECT cluster_id, event_id, node_id, comm_hash, seq, op, nranks, reason, missing_ranks,"
    " missing_nodes, missing_count, inside_ranks, inside_for_s, coalesce(since_ts, start_ts),"
    " start_ts, last_ts, end_ts, end_reason FROM collective_episodes WHERE type = ? AND {where}"
    " ORDER BY end_ts IS NOT NULL, coalesce(since_ts, start_ts) DESC, comm_hash, seq LIMIT ?"
)


def hangs(
    conn: sqlite3.Connection, where: str, params: Sequence[Any], window: Window, limit: int
) -> list[dict[str, Any]]:
    """Hung collectives that overlap ``window`` among those ``where`` selects: those
    still open first, then the most recent (by when the ranks went in)."""
    sql = _HANGS_SQL.format(where=_window(where))
    return [
        {
            "cluster_id": c,
            "event_id": eid,
            "comm_hash": comm,
            "seq": seq,
            "op": op,
            "nranks": nranks,
            "reason": reason,
            "missing_ranks": json.loads(ranks) if ranks else [],
            "missing_nodes": json.loads(nodes) if nodes else [],
            "missing_count": n_missing,
            "node_id": node or None,
            "inside_ranks": inside,
            "inside_for_s": inside_for,
            "since": since,
            "detected": start,
            "last_seen": last,
            "ended": end,
            "end_reason": end_reason,
            "open": end is None,
        }
        for (
            c, eid, node, comm, seq, op, nranks, reason, ranks, nodes, n_missing, inside,
            inside_for, since, start, last, end, end_reason,
        ) in conn.execute(sql, [HANG, *params, window[1], window[0], limit])
    ]  # fmt: skip


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
            worst = n["max_abs_offset_ms"]
            n["max_abs_offset_ms"] = abs(offset) if worst is None else max(worst, abs(offset))
        n["events"] += 1
        n["first_seen"] = min(n["first_seen"], ts)
    return sorted(
        nodes.values(),
        key=lambda n: (-(n["max_abs_offset_ms"] or 0.0), n["cluster_id"], n["node_id"]),
    )
