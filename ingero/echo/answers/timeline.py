"""One job over time, bounded whatever its size: its nodes, the score band and series, the
episodes and drains, the NCCL lag heatmap.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from ingero.echo import collectives
from ingero.echo.answers.common import (
    DRAIN_TYPES,
    EVENT,
    EVENT_COLUMNS,
    P_CLUSTER,
    P_LAST,
    P_LIMIT,
    WINDOW,
    event_row,
    question,
    row_limit,
    scope,
    window,
)
from ingero.echo.questions import (
    INT,
    INT_N,
    NUM,
    NUM_N,
    STR,
    STR_N,
    Context,
    Param,
    answer_schema,
    list_of,
    obj,
)

# The job timeline's time axis, at most this many columns (scores, heatmap).
TIMELINE_COLUMNS = 120
# The heatmap's rows: ranks are grouped into at most this many (a 1,000-rank job stays small).
HEATMAP_ROWS = 32


def _columns(since: float, until: float, n: int) -> tuple[float, float]:
    """The start and width of ``n`` equal columns over the window (width > 0)."""
    return since, max((until - since) / n, 1e-6)


@question(
    "job_timeline",
    "One job over time, bounded whatever its size: its nodes (stragglers first) with"
    " rank, score and threshold; the score band (lowest, mean, highest) of all its"
    " nodes per time column and the series of"
    " its lowest; straggler episodes and drains; NCCL entry lag by rank and time",
    (
        Param("job_id", "string", "Slurm job id", required=True),
        P_CLUSTER,
        Param("since", "number", "Window start, Unix seconds; default: the job's first"),
        Param("until", "number", "Window end, Unix seconds; default: the job's last"),
        P_LAST,
        Param(
            "columns",
            "integer",
            "Time columns of the band, the series and the heatmap",
            default=TIMELINE_COLUMNS,
            minimum=2,
            maximum=1000,
        ),
        P_LIMIT,
    ),
    answer_schema(
        {
            "job_id": STR,
            "found": {"type": "boolean"},
            "window": WINDOW,
            "node_count": INT,
            "nodes": list_of(
                obj(
                    {
                        "cluster_id": STR,
                        "node_id": STR,
                        "rank": INT_N,
                        "score": NUM_N,
                        "threshold": NUM_N,
                        "min_score": NUM_N,
                        "straggling": {"type": "boolean"},
                        "episodes": INT,
                        "last_seen": NUM_N,
                        "signal": {
                            **STR_N,
                            "description": "dominant_signal of its last straggler_state",
                        },
                        "reason": {
                            **STR_N,
                            "description": "reason of its last straggler_state (stall, peer_lag)",
                        },
                    }
                )
            ),
            "band": list_of(obj({"t": NUM, "min": NUM, "mean": NUM, "max": NUM})),
            "series": list_of(obj({"node_id": STR, "points": list_of(list_of(NUM))})),
            "thresholds": list_of(list_of(NUM)),
            "episodes": list_of(
                obj(
                    {
                        "cluster_id": STR,
                        "node_id": STR,
                        "start": NUM,
                        "end": NUM_N,
                        "last_seen": NUM,
                        "max_depth": NUM_N,
                        "min_score": NUM_N,
                    }
                )
            ),
            "drains": list_of(EVENT),
            "lag_heatmap": obj(
                {
                    "ranks": list_of(list_of(INT)),
                    "columns": list_of(NUM),
                    "cells": list_of(list_of(NUM_N)),
                    "max_ms": NUM_N,
                }
            ),
        }
    ),
)
def job_timeline(conn: sqlite3.Connection, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """One job over time, bounded whatever its size: per node its rank, last score and
    state; the score band of all its nodes and the series of its lowest ones against the
    threshold; straggler episodes and drains; and a heatmap of NCCL entry lag by rank."""
    where, params = scope(ctx, args)
    job = args["job_id"]
    limit = row_limit(args, ctx)
    if args.get("since") is None and args.get("last") is None:
        # the job's whole span by default, as job_report reads it
        first, last = conn.execute(
            f"SELECT min(ts), max(ts) FROM events WHERE job_id = ? AND {where}", [job, *params]
        ).fetchone()
        s_first, s_last = conn.execute(
            f"SELECT min(bucket), max(bucket) FROM scores WHERE job_id = ? AND {where}",
            [job, *params],
        ).fetchone()
        starts = [t for t in (first, s_first) if t is not None]
        ends = [t for t in (last, s_last) if t is not None]
        until = float(args["until"]) if args.get("until") is not None else max([*ends, 0.0])
        since = min(starts) if starts else until
    else:
        since, until = window(args, ctx)
    columns = int(args.get("columns") or TIMELINE_COLUMNS)
    start, width = _columns(since, until, columns)

    # nodes: from events (rank, last score) and score samples
    nodes: dict[tuple[str, str], dict[str, Any]] = {}

    def node(cid: str, nid: str) -> dict[str, Any]:
        return nodes.setdefault(
            (cid, nid),
            {
                "cluster_id": cid,
                "node_id": nid,
                "rank": None,
                "score": None,
                "threshold": None,
                "min_score": None,
                "straggling": False,
                "episodes": 0,
                "last_seen": None,
                "signal": None,
                "reason": None,
            },
        )

    for cid, nid, rank, last in conn.execute(
        f"SELECT cluster_id, node_id, min(rank), max(ts) FROM events WHERE job_id = ? AND {where}"
        " AND ts >= ? AND ts <= ? GROUP BY cluster_id, node_id",
        [job, *params, since, until],
    ):
        r = node(cid, nid)
        r.update(rank=rank, last_seen=last)
    # Each node's last and lowest score, and the band of all nodes per column, folded in
    # SQL: a 1,000-rank job's hour of samples is 60,000 rows, not one of them in Python.
    # (A bare column with max() is that row's: the last sample's mean.)
    scored: set[tuple[str, str]] = set()
    job_scores = f"FROM scores WHERE job_id = ? AND {where} AND bucket >= ? AND bucket <= ?"
    job_args = [job, *params, since, until]
    for cid, nid, last, mean, low in conn.execute(
        f"SELECT cluster_id, node_id, max(bucket), sum / n, min(min) {job_scores}"
        " GROUP BY cluster_id, node_id",
        job_args,
    ):
        r = node(cid, nid)
        r.update(score=mean, min_score=low)
        r["last_seen"] = max(r["last_seen"] or last, last)
        scored.add((cid, nid))
    band = conn.execute(
        "SELECT min(CAST((bucket - ?) / ? AS INTEGER), ?) AS col,"
        f" min(sum / n), avg(sum / n), max(sum / n) {job_scores} GROUP BY col ORDER BY col",
        [start, width, columns - 1, *job_args],
    ).fetchall()
    thresholds: list[list[float]] = []
    said: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for cid, nid, ts, score, threshold, kind, signal, reason in conn.execute(
        "SELECT cluster_id, node_id, ts, score, threshold, type, dominant_signal,"
        " json_extract(extra, '$.reason') FROM events"
        f" WHERE job_id = ? AND {where} AND ts >= ? AND ts <= ? AND threshold IS NOT NULL"
        " ORDER BY ts",
        [job, *params, since, until],
    ):
        r = node(cid, nid)
        r["threshold"] = threshold
        if score is not None and r["score"] is None:
            r["score"] = score
        if kind == "straggler_state":
            r["signal"] = signal
            r["reason"] = reason if isinstance(reason, str) else None
        thresholds.append([ts, threshold])
        if score is not None:  # a straggler's events say its score between samples too
            said.setdefault((cid, nid), []).append((ts, score))
    episodes = []
    for cid, nid, s, e, last, depth, low in conn.execute(
        "SELECT cluster_id, node_id, start_ts, end_ts, last_ts, max_depth, min_score"
        f" FROM episodes WHERE job_id = ? AND {where} AND start_ts <= ?"
        " AND coalesce(end_ts, last_ts) >= ? ORDER BY start_ts",
        [job, *params, until, since],
    ):
        r = node(cid, nid)
        r["episodes"] += 1
        r["straggling"] = r["straggling"] or e is None
        episodes.append(
            {
                "cluster_id": cid,
                "node_id": nid,
                "start": s,
                "end": e,
                "last_seen": last,
                "max_depth": depth,
                "min_score": low,
            }
        )
    # drains name a node, not always a job: the job's nodes' drains in its window
    drained = [
        event_row(row)
        for row in conn.execute(
            f"SELECT {EVENT_COLUMNS} FROM events WHERE type IN (?,?,?) AND {where}"
            " AND ts >= ? AND ts <= ? AND (cluster_id, node_id) IN"
            f" (SELECT DISTINCT cluster_id, node_id FROM events WHERE job_id = ? AND {where})"
            " ORDER BY ts LIMIT ?",
            [*DRAIN_TYPES, *params, since, until, job, *params, limit],
        )
    ]
    heatmap = _lag_heatmap(conn, job, where, params, (since, until), columns)
    # stragglers first, then lowest score: what a reader looks for is at the top
    ordered = sorted(
        nodes.values(),
        key=lambda r: (
            not r["straggling"],
            -r["episodes"],
            r["min_score"] if r["min_score"] is not None else 2.0,
            r["node_id"],
        ),
    )
    series = []
    scored.update(said)
    charted = [r for r in ordered if (r["cluster_id"], r["node_id"]) in scored]
    for r in charted[:SERIES_NODES]:
        key = (r["cluster_id"], r["node_id"])
        points = conn.execute(
            "SELECT bucket, sum / n FROM scores WHERE cluster_id = ? AND node_id = ?"
            " AND bucket >= ? AND bucket <= ? ORDER BY bucket",
            [*key, since, until],
        ).fetchall()
        points = sorted([*points, *said.get(key, [])])
        series.append({"node_id": r["node_id"], "points": _thin(points, start, width, columns)})
    return {
        "job_id": job,
        "found": bool(nodes),
        "window": {"since": since, "until": until},
        "node_count": len(nodes),
        "nodes": ctx.fit(ordered[:limit]),
        "band": [
            {"t": start + (i + 0.5) * width, "min": low, "mean": mean, "max": high}
            for i, low, mean, high in band
        ],
        "series": ctx.fit(series),
        "thresholds": _thin_pairs(thresholds, start, width, columns),
        "episodes": ctx.fit(episodes[:limit]),
        "drains": ctx.fit(drained[:limit]),
        "lag_heatmap": heatmap,
    }


# The job timeline's score series: its lowest nodes, at most this many.
SERIES_NODES = 8


def _thin(
    points: list[tuple[float, float]], start: float, width: float, columns: int
) -> list[list[float]]:
    """At most one point per column, the column's lowest (a dip is what matters)."""
    kept: dict[int, tuple[float, float]] = {}
    for t, v in points:
        i = min(columns - 1, max(0, int((t - start) / width)))
        if i not in kept or v < kept[i][1]:
            kept[i] = (t, v)
    return [[t, v] for t, v in (kept[i] for i in sorted(kept))]


def _thin_pairs(
    points: list[list[float]], start: float, width: float, columns: int
) -> list[list[float]]:
    """The threshold at most once per column: the column's last value."""
    kept: dict[int, list[float]] = {}
    for t, v in points:
        kept[min(columns - 1, max(0, int((t - start) / width)))] = [t, v]
    return [kept[i] for i in sorted(kept)]


def _lag_heatmap(
    conn: sqlite3.Connection,
    job: str,
    where: str,
    params: list[Any],
    window: tuple[float, float],
    columns: int,
) -> dict[str, Any]:
    """NCCL entry lag (ms, the worst median) of the job's ranks by time: ranks grouped into
    at most HEATMAP_ROWS rows, time into ``columns``; a cell is its ranks' worst lag."""
    since, until = window
    start, width = _columns(since, until, columns)
    rows = conn.execute(
        "SELECT rank, start_ts, coalesce(end_ts, last_ts), max_lag_p50_ms FROM collective_episodes"
        f" WHERE type = ? AND job_id = ? AND {where} AND rank IS NOT NULL"
        " AND start_ts <= ? AND coalesce(end_ts, last_ts) >= ?",
        [collectives.LAG, job, *params, until, since],
    ).fetchall()
    if not rows:
        return {"ranks": [], "columns": [], "cells": [], "max_ms": None}
    top = max(int(r[0]) for r in rows)
    per_row = max(1, -(-(top + 1) // HEATMAP_ROWS))
    groups = -(-(top + 1) // per_row)
    cells: list[list[float | None]] = [[None] * columns for _ in range(groups)]
    for rank, s, e, lag in rows:
        if lag is None:
            continue
        g = int(rank) // per_row
        first = min(columns - 1, max(0, int((s - start) / width)))
        last = min(columns - 1, max(0, int((e - start) / width)))
        for i in range(first, last + 1):
            cell = cells[g][i]
            cells[g][i] = lag if cell is None else max(cell, lag)
    return {
        "ranks": [[g * per_row, min(top, (g + 1) * per_row - 1)] for g in range(groups)],
        "columns": [start + (i + 0.5) * width for i in range(columns)],
        "cells": cells,
        "max_ms": max((c for row in cells for c in row if c is not None), default=None),
    }
