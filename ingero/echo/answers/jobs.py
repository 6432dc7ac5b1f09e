"""Slurm jobs: the jobs seen in the window and everything about one."""

from __future__ import annotations

import sqlite3
from typing import Any

from ingero.echo.answers.common import (
    DRAIN_TYPES,
    EVENT,
    EVENT_COLUMNS,
    LAG_RANK,
    P_CLUSTER,
    P_LAST,
    P_LIMIT,
    P_SINCE,
    P_UNTIL,
    SNAPSHOT,
    STRAGGLER,
    WINDOW,
    event_row,
    question,
    row_limit,
    scope,
    window,
)
from ingero.echo.answers.lag import job_lag
from ingero.echo.answers.stragglers import ranked_stragglers
from ingero.echo.questions import (
    INT,
    NUM_N,
    STR,
    Context,
    Param,
    answer_schema,
    list_of,
    obj,
)

# A job is running while something of it (an event, a score sample) is this recent.
JOB_ACTIVE_S = 300.0


@question(
    "jobs",
    "Jobs seen in the window, per cluster: running ones first, then the most recent,"
    " with their nodes and straggler episodes",
    (P_CLUSTER, P_SINCE, P_UNTIL, P_LAST, P_LIMIT),
    answer_schema(
        {
            "window": WINDOW,
            "jobs": list_of(
                obj(
                    {
                        "cluster_id": STR,
                        "job_id": STR,
                        "nodes": INT,
                        "first_seen": NUM_N,
                        "last_seen": NUM_N,
                        "events": INT,
                        "straggler_episodes": INT,
                        "open_episodes": INT,
                        "running": {
                            "type": "boolean",
                            "description": "Seen (an event or a score sample) within"
                            f" the last {JOB_ACTIVE_S:g} s",
                        },
                    }
                )
            ),
        }
    ),
)
def jobs(conn: sqlite3.Connection, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """The jobs seen in the window, per cluster: running ones (seen within JOB_ACTIVE_S)
    first, then the most recent."""
    where, params = scope(ctx, args)
    since, until = window(args, ctx)
    found: dict[tuple[str, str], dict[str, Any]] = {}

    def job(cid: str, jid: str) -> dict[str, Any]:
        return found.setdefault(
            (cid, jid),
            {
                "cluster_id": cid,
                "job_id": jid,
                "nodes": 0,
                "first_seen": None,
                "last_seen": None,
                "events": 0,
                "straggler_episodes": 0,
                "open_episodes": 0,
                "running": False,
            },
        )

    def widen(r: dict[str, Any], first: float | None, last: float | None) -> None:
        if first is not None:
            r["first_seen"] = first if r["first_seen"] is None else min(r["first_seen"], first)
        if last is not None:
            r["last_seen"] = last if r["last_seen"] is None else max(r["last_seen"], last)

    for cid, jid, first, last, n, nodes in conn.execute(
        "SELECT cluster_id, job_id, min(ts), max(ts), count(*), count(DISTINCT node_id)"
        f" FROM events WHERE {where} AND job_id IS NOT NULL AND ts >= ? AND ts <= ?"
        " GROUP BY cluster_id, job_id",
        [*params, since, until],
    ):
        r = job(cid, jid)
        r.update(events=n, nodes=nodes)
        widen(r, first, last)
    for cid, jid, first, last, nodes in conn.execute(
        "SELECT cluster_id, job_id, min(bucket), max(bucket), count(DISTINCT node_id)"
        f" FROM scores WHERE {where} AND job_id IS NOT NULL AND bucket >= ? AND bucket <= ?"
        " GROUP BY cluster_id, job_id",
        [*params, since, until],
    ):
        r = job(cid, jid)
        r["nodes"] = max(r["nodes"], nodes)
        widen(r, first, last)
    for cid, jid, n, open_ in conn.execute(
        "SELECT cluster_id, job_id, count(*), sum(end_ts IS NULL) FROM episodes"
        f" WHERE {where} AND start_ts <= ? AND coalesce(end_ts, last_ts) >= ?"
        " GROUP BY cluster_id, job_id",
        [*params, until, since],
    ):
        if (cid, jid) in found:
            found[(cid, jid)].update(straggler_episodes=n, open_episodes=open_ or 0)
    for r in found.values():
        r["running"] = r["last_seen"] is not None and r["last_seen"] >= ctx.now - JOB_ACTIVE_S
    ordered = sorted(
        found.values(), key=lambda r: (not r["running"], -(r["last_seen"] or 0.0), r["job_id"])
    )
    return {
        "window": {"since": since, "until": until},
        "jobs": ctx.fit(ordered[: row_limit(args, ctx)]),
    }


@question(
    "job_report",
    "Everything about one Slurm job: nodes, event counts, stragglers, drains,"
    " NCCL peer-lag and hung-collective events, its ranks ranked by NCCL entry lag,"
    " job summaries, and the stack snapshots of its stalled or awaited ranks",
    (Param("job_id", "string", "Slurm job id", required=True), P_CLUSTER),
    answer_schema(
        {
            "job_id": STR,
            "found": {"type": "boolean"},
            "first_event": NUM_N,
            "last_event": NUM_N,
            "event_counts": {"type": "object", "additionalProperties": INT},
            "nodes": list_of(obj({"cluster_id": STR, "node_id": STR, "events": INT})),
            "stragglers": list_of(STRAGGLER),
            "drains": list_of(EVENT),
            "summaries": list_of(EVENT),
            "peer_lag": list_of(EVENT),
            "collective_hangs": list_of(EVENT),
            "lagging_ranks": list_of(LAG_RANK),
            "answers": list_of(STR),
            "stack_snapshots": list_of(SNAPSHOT),
        }
    ),
)
def job_report(conn: sqlite3.Connection, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    where, params = scope(ctx, args)
    job = args["job_id"]
    first, last, n = conn.execute(
        f"SELECT min(ts), max(ts), count(*) FROM events WHERE job_id = ? AND {where}",
        [job, *params],
    ).fetchone()
    counts = dict(
        conn.execute(
            f"SELECT type, count(*) FROM events WHERE job_id = ? AND {where} GROUP BY type",
            [job, *params],
        ).fetchall()
    )
    nodes = ctx.fit(
        {"cluster_id": c, "node_id": nid, "events": k}
        for c, nid, k in conn.execute(
            f"SELECT cluster_id, node_id, count(*) FROM events WHERE job_id = ? AND {where}"
            " GROUP BY cluster_id, node_id ORDER BY cluster_id, node_id",
            [job, *params],
        )
    )
    window_args = {**args, "since": 0.0, "until": max(ctx.now, last or 0.0), "limit": None}
    ranked = ctx.fit(ranked_stragglers(conn, ctx, window_args)["stragglers"])

    def of_type(kind: str) -> list[dict[str, Any]]:
        return ctx.fit(
            event_row(r)
            for r in conn.execute(
                f"SELECT {EVENT_COLUMNS} FROM events WHERE job_id = ? AND type = ?"
                f" AND {where} ORDER BY ts LIMIT ?",
                [job, kind, *params, ctx.max_rows],
            )
        )

    lag = job_lag(conn, ctx, window_args)
    drained = ctx.fit(
        event_row(r)
        for r in conn.execute(
            f"SELECT {EVENT_COLUMNS} FROM events WHERE job_id = ? AND type IN (?,?,?)"
            f" AND {where} ORDER BY ts LIMIT ?",
            [job, *DRAIN_TYPES, *params, ctx.max_rows],
        )
    )
    return {
        "job_id": job,
        "found": n > 0,
        "first_event": first,
        "last_event": last,
        "event_counts": counts,
        "nodes": nodes,
        "stragglers": ranked,
        "drains": drained,
        "summaries": of_type("job_summary"),
        "peer_lag": of_type("peer_lag"),
        "collective_hangs": of_type("collective_hang"),
        "lagging_ranks": ctx.fit(lag["ranks"]),
        # where the ranks everyone waited for were in their code, newest hang first
        "answers": [h["answer"] for h in lag["hangs"] if h["answer"]],
        "stack_snapshots": ctx.fit(lag["stack_snapshots"]),
    }
