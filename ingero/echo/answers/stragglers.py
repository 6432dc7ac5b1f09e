"""The cluster's health from its score history: the summary, the stragglers and outliers,
and what straggling cost.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
from typing import Any

from ingero.echo import collectives
from ingero.echo.answers.common import (
    P_CLUSTER,
    P_JOB,
    P_LAST,
    P_LIMIT,
    P_SINCE,
    P_UNTIL,
    STRAGGLER,
    WINDOW,
    question,
    row_limit,
    scope,
    window,
)
from ingero.echo.questions import (
    INT,
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


@question(
    "summary",
    "Cluster summary: nodes, events, drains and straggler episodes per cluster",
    (P_CLUSTER, P_SINCE, P_UNTIL, P_LAST),
    answer_schema(
        {
            "window": WINDOW,
            "clusters": list_of(
                obj(
                    {
                        "cluster_id": STR,
                        "nodes": INT,
                        "events": INT,
                        "drains": INT,
                        "straggler_episodes": INT,
                        "open_episodes": INT,
                        "straggler_nodes": INT,
                        "last_event": NUM_N,
                    }
                )
            ),
        }
    ),
)
def summary(conn: sqlite3.Connection, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    where, params = scope(ctx, args)
    since, until = window(args, ctx)
    rows: dict[str, dict[str, Any]] = {}
    for cid, nodes in conn.execute(
        f"SELECT cluster_id, count(*) FROM nodes WHERE {where} GROUP BY cluster_id", params
    ):
        rows.setdefault(cid, _empty_summary(cid))["nodes"] = nodes
    for cid, n, drains, last in conn.execute(
        "SELECT cluster_id, count(*), sum(type = 'node_drained'), max(ts) FROM events"
        f" WHERE {where} AND ts >= ? AND ts <= ? GROUP BY cluster_id",
        [*params, since, until],
    ):
        r = rows.setdefault(cid, _empty_summary(cid))
        r.update(events=n, drains=drains or 0, last_event=last)
    for cid, n, open_, nodes in conn.execute(
        "SELECT cluster_id, count(*), sum(end_ts IS NULL), count(DISTINCT node_id) FROM episodes"
        f" WHERE {where} AND start_ts <= ? AND coalesce(end_ts, last_ts) >= ? GROUP BY cluster_id",
        [*params, until, since],
    ):
        r = rows.setdefault(cid, _empty_summary(cid))
        r.update(straggler_episodes=n, open_episodes=open_ or 0, straggler_nodes=nodes)
    return {
        "window": {"since": since, "until": until},
        "clusters": ctx.fit(rows[k] for k in sorted(rows)),
    }


def _empty_summary(cluster_id: str) -> dict[str, Any]:
    return {
        "cluster_id": cluster_id,
        "nodes": 0,
        "events": 0,
        "drains": 0,
        "straggler_episodes": 0,
        "open_episodes": 0,
        "straggler_nodes": 0,
        "last_event": None,
    }


_ORDER = {"time": "seconds_below", "depth": "max_depth", "episodes": "episodes"}


@question(
    "stragglers",
    "Straggling nodes ranked by time below threshold, depth or number of episodes",
    (
        P_CLUSTER,
        P_JOB,
        P_SINCE,
        P_UNTIL,
        P_LAST,
        Param(
            "order_by",
            "string",
            "Rank by time below threshold, max depth below it, or episodes",
            default="time",
            enum=("time", "depth", "episodes"),
        ),
        P_LIMIT,
    ),
    answer_schema({"window": WINDOW, "order_by": STR, "stragglers": list_of(STRAGGLER)}),
)
def stragglers(conn: sqlite3.Connection, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    answer = ranked_stragglers(conn, ctx, args)
    answer["stragglers"] = ctx.fit(answer["stragglers"])
    return answer


def ranked_stragglers(
    conn: sqlite3.Connection, ctx: Context, args: dict[str, Any]
) -> dict[str, Any]:
    """The ranking whole (``job_report`` and ``cost`` work from it; only answers are cut)."""
    where, params = scope(ctx, args)
    since, until = window(args, ctx)
    if args.get("job_id") is not None:
        where += " AND job_id = ?"
        params.append(args["job_id"])
    order = _ORDER[args.get("order_by") or "time"]
    sql = (
        "SELECT cluster_id, node_id,"
        " sum(min(coalesce(end_ts, last_ts), ?) - max(start_ts, ?)) AS seconds_below,"
        " max(max_depth) AS max_depth, count(*) AS episodes, max(end_ts IS NULL) AS open,"
        " max(last_ts) AS last_seen"
        f" FROM episodes WHERE {where} AND start_ts <= ? AND coalesce(end_ts, last_ts) >= ?"
        f" GROUP BY cluster_id, node_id ORDER BY {order} DESC, node_id LIMIT ?"
    )
    rows = conn.execute(sql, [until, since, *params, until, since, row_limit(args, ctx)])
    ranked = [
        {
            "cluster_id": c,
            "node_id": n,
            "seconds_below": max(0.0, float(s)),
            "max_depth": d,
            "episodes": e,
            "open": bool(o),
            "last_seen": last,
            "peer_lag_ms": None,
            "collective_hangs": 0,
        }
        for c, n, s, d, e, o, last in rows
    ]
    _add_collectives(conn, ranked, where, params, since, until)
    return {
        "window": {"since": since, "until": until},
        "order_by": args.get("order_by") or "time",
        "stragglers": ranked,
    }


def _add_collectives(
    conn: sqlite3.Connection,
    ranked: list[dict[str, Any]],
    where: str,
    params: list[Any],
    since: float,
    until: float,
) -> None:
    """Each straggler's NCCL side in the window (``where``/``params``: scope and job): the
    worst entry lag of its ranks, and the hangs that name it among the missing nodes."""
    if not ranked:
        return
    by_node = {(r["cluster_id"], r["node_id"]): r for r in ranked}
    overlap = f"{where} AND start_ts <= ? AND coalesce(end_ts, last_ts) >= ?"
    for c, n, lag in conn.execute(
        "SELECT cluster_id, node_id, max(max_lag_p50_ms) FROM collective_episodes"
        f" WHERE type = ? AND {overlap} GROUP BY cluster_id, node_id",
        [collectives.LAG, *params, until, since],
    ):
        if (c, n) in by_node:
            by_node[(c, n)]["peer_lag_ms"] = lag
    for c, missing in conn.execute(
        f"SELECT cluster_id, missing_nodes FROM collective_episodes WHERE type = ? AND {overlap}",
        [collectives.HANG, *params, until, since],
    ):
        for node in set(json.loads(missing)) if missing else ():
            if (c, node) in by_node:
                by_node[(c, node)]["collective_hangs"] += 1


@question(
    "outliers",
    "Nodes whose mean health score is far below their cluster's median",
    (
        P_CLUSTER,
        P_SINCE,
        P_UNTIL,
        P_LAST,
        Param("k", "number", "MADs below the median", default=3.0, minimum=0.1),
        P_LIMIT,
    ),
    answer_schema(
        {
            "window": WINDOW,
            "outliers": list_of(
                obj(
                    {
                        "cluster_id": STR,
                        "node_id": STR,
                        "mean_score": NUM,
                        "samples": INT,
                        "cluster_median": NUM,
                        "cutoff": NUM,
                        "deviation": NUM,
                    }
                )
            ),
        }
    ),
)
def outliers(conn: sqlite3.Connection, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Nodes whose mean score sits far below their cluster's median (robust, MAD-based)."""
    where, params = scope(ctx, args)
    since, until = window(args, ctx)
    k = float(args.get("k") or 3.0)
    per_cluster: dict[str, list[tuple[str, float, int]]] = {}
    for cid, nid, mean, n in conn.execute(
        "SELECT cluster_id, node_id, sum(sum) / sum(n), sum(n) FROM scores"
        f" WHERE {where} AND bucket >= ? AND bucket <= ? GROUP BY cluster_id, node_id",
        [*params, since, until],
    ):
        per_cluster.setdefault(cid, []).append((nid, float(mean), int(n)))
    found: list[dict[str, Any]] = []
    for cid, nodes in per_cluster.items():
        if len(nodes) < 3:
            continue  # too few peers for a median to mean anything
        means = [m for _, m, _ in nodes]
        median = statistics.median(means)
        mad = statistics.median(abs(m - median) for m in means)
        cut = median - max(k * 1.4826 * mad, 0.05)
        for nid, mean, n in nodes:
            if mean < cut:
                found.append(
                    {
                        "cluster_id": cid,
                        "node_id": nid,
                        "mean_score": mean,
                        "samples": n,
                        "cluster_median": median,
                        "cutoff": cut,
                        "deviation": median - mean,
                    }
                )
    found.sort(key=lambda r: -r["deviation"])
    return {
        "window": {"since": since, "until": until},
        "outliers": ctx.fit(found[: row_limit(args, ctx)]),
    }


@question(
    "cost",
    "Cost of straggling: GPU-hours lost x the hourly rate of each node's GPU model",
    (P_CLUSTER, P_JOB, P_SINCE, P_UNTIL, P_LAST, P_LIMIT),
    answer_schema(
        {
            "window": WINDOW,
            "currency": STR,
            "total_gpu_hours_lost": NUM,
            "total_cost": NUM,
            "nodes": list_of(
                obj(
                    {
                        "cluster_id": STR,
                        "node_id": STR,
                        "gpu_model": STR_N,
                        "gpu_count": INT,
                        "seconds_below": NUM,
                        "gpu_hours_lost": NUM,
                        "rate_per_gpu_hour": NUM,
                        "cost": NUM,
                    }
                )
            ),
            "notes": list_of(STR),
        }
    ),
)
def cost(conn: sqlite3.Connection, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """GPU-hours lost while a node straggled (its whole allocation waits) x the model's rate."""
    ranked = ranked_stragglers(conn, ctx, {**args, "order_by": "time", "limit": None})["stragglers"]
    facts = {
        (c, n): (m, g)
        for c, n, m, g in conn.execute(
            "SELECT cluster_id, node_id, gpu_model, gpu_count FROM nodes"
        )
    }
    rows: list[dict[str, Any]] = []
    assumed = 0
    for r in ranked:
        model, count = facts.get((r["cluster_id"], r["node_id"]), (None, None))
        if not count:
            assumed += 1
        gpus = int(count or 1)
        hours = r["seconds_below"] / 3600.0 * gpus
        rate = ctx.rates.rate(model)
        rows.append(
            {
                "cluster_id": r["cluster_id"],
                "node_id": r["node_id"],
                "gpu_model": model,
                "gpu_count": gpus,
                "seconds_below": r["seconds_below"],
                "gpu_hours_lost": hours,
                "rate_per_gpu_hour": rate,
                "cost": hours * rate,
            }
        )
    rows.sort(key=lambda r: -r["cost"])
    since, until = window(args, ctx)
    notes = ["time below threshold x GPUs of the node x hourly rate of its GPU model"]
    if assumed:
        notes.append(f"{assumed} node(s) with unknown GPU count counted as 1 GPU")
    return {
        "window": {"since": since, "until": until},
        "currency": ctx.rates.currency,
        "total_gpu_hours_lost": sum(r["gpu_hours_lost"] for r in rows),
        "total_cost": sum(r["cost"] for r in rows),
        "nodes": ctx.fit(rows[: row_limit(args, ctx)]),
        "notes": notes,
    }


# A job is running while something of it (an event, a score sample) is this recent.
