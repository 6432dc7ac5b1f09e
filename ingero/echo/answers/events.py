"""The event history: events, drains, and the GPUs jobs held idle (gpu_idle episodes)."""

from __future__ import annotations

import sqlite3
from typing import Any

from ingero.echo.answers.common import (
    DRAIN_TYPES,
    EVENT,
    EVENT_COLUMNS,
    P_CLUSTER,
    P_JOB,
    P_LAST,
    P_LIMIT,
    P_NODE,
    P_SINCE,
    P_UNTIL,
    WINDOW,
    event_row,
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
from ingero.echo.schema import EVENTS_BY_CLUSTER


@question(
    "events",
    "Event history, newest first, filtered by cluster, node, job, type and window",
    (
        P_CLUSTER,
        P_NODE,
        P_JOB,
        Param("type", "string", "Event type, e.g. straggler_state"),
        P_SINCE,
        P_UNTIL,
        P_LAST,
        P_LIMIT,
    ),
    answer_schema({"window": WINDOW, "events": list_of(EVENT)}),
)
def events(conn: sqlite3.Connection, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    where, params = scope(ctx, args)
    since, until = window(args, ctx)
    for key in ("node_id", "job_id", "type"):
        if args.get(key) is not None:
            where += f" AND {key} = ?"
            params.append(args[key])
    source = "events"
    if args.get("node_id") is not None:
        # Events are indexed by (cluster, time, node), not by node (a per-node index made
        # every insert land on its own page): a node's events are found in its clusters'
        # time ranges of that index. The planner would rather walk the time index in
        # ORDER BY order and test every event in the window, hence INDEXED BY.
        source = f"events INDEXED BY {EVENTS_BY_CLUSTER}"
        if args.get("cluster_id") is None:
            where += " AND cluster_id IN (SELECT cluster_id FROM nodes WHERE node_id = ?)"
            params.append(args["node_id"])
    rows = conn.execute(
        f"SELECT {EVENT_COLUMNS} FROM {source} WHERE {where} AND ts >= ? AND ts <= ?"
        " ORDER BY ts DESC, id DESC LIMIT ?",
        [*params, since, until, row_limit(args, ctx)],
    )
    return {
        "window": {"since": since, "until": until},
        "events": ctx.fit(event_row(r) for r in rows),
    }


@question(
    "idle_gpus",
    "GPUs Slurm jobs held and did not use (no process, or 0% busy and no launches):"
    " the gpu_idle episodes of the window with job, user, partition, GPUs and since"
    " when, open ones first, and GPU-hours per cluster, partition and user",
    (
        P_CLUSTER,
        P_JOB,
        P_NODE,
        Param("user", "string", "The jobs' Slurm user"),
        P_SINCE,
        P_UNTIL,
        P_LAST,
        P_LIMIT,
    ),
    answer_schema(
        {
            "window": WINDOW,
            "totals": list_of(
                obj(
                    {
                        "cluster_id": STR,
                        "partition": STR_N,
                        "user": STR_N,
                        "episodes": INT,
                        "gpu_hours": NUM,
                        "gpus_idle_now": INT,
                    }
                )
            ),
            "episodes": list_of(
                obj(
                    {
                        "event_id": STR,
                        "cluster_id": STR,
                        "node_id": STR,
                        "job_id": STR_N,
                        "user": STR_N,
                        "partition": STR_N,
                        "gpus": list_of(INT),
                        "reason": STR_N,
                        "since": NUM_N,
                        "end": {**NUM_N, "description": "when it ended; null: open"},
                        "end_reason": STR_N,
                        "open": {"type": "boolean"},
                        "idle_s": {
                            **NUM_N,
                            "description": "its length; an open one's up to until",
                        },
                        "gpu_hours": NUM,
                    }
                )
            ),
        }
    ),
)
def idle_gpus(conn: sqlite3.Connection, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """The gpu_idle episodes open in the window (started in it, ended in it, or open
    across it), each folded from its start and end events, and their GPU-hours."""
    where, params = scope(ctx, args)
    since, until = window(args, ctx)
    for key in ("job_id", "node_id"):
        if args.get(key) is not None:
            where += f" AND {key} = ?"
            params.append(args[key])
    if args.get("user") is not None:  # both of an episode's events carry it
        where += " AND json_extract(extra, '$.user') = ?"
        params.append(args["user"])
    # An episode in the window: an event of it in the window, or no end before it.
    rows = conn.execute(
        f"SELECT {EVENT_COLUMNS} FROM events WHERE type = 'gpu_idle' AND {where} AND ts <= ?"
        " AND event_id IN (SELECT event_id FROM events WHERE type = 'gpu_idle'"
        f" AND {where} AND ts <= ? GROUP BY event_id HAVING max(ts) >= ?"
        " OR sum(json_extract(extra, '$.state') = 'end') = 0) ORDER BY ts, id",
        [*params, until, *params, until, since],
    )
    folded: dict[str, dict[str, Any]] = {}
    for row in rows:
        e = event_row(row)
        x = e["extra"]
        ep = folded.setdefault(e["event_id"], {"event_id": e["event_id"], "end": None,
                                                "idle_s": None, "end_reason": None})  # fmt: skip
        if x.get("state") == "end":
            ep.update(end=e["timestamp"], idle_s=x.get("idle_s"), end_reason=x.get("end"))
        for key in ("cluster_id", "node_id", "job_id"):
            ep.setdefault(key, e[key])
        for key in ("user", "partition", "gpus", "since", "reason"):
            if ep.get(key) is None:
                ep[key] = x.get(key)
    episodes = []
    for ep in folded.values():
        gpus = ep["gpus"] if isinstance(ep.get("gpus"), list) else []
        start = float(ep["since"]) if isinstance(ep.get("since"), int | float) else None
        ep["open"] = ep["end"] is None
        if ep["open"] and start is not None:
            ep["idle_s"] = max(0.0, until - start)
        idle_s = ep["idle_s"] if isinstance(ep["idle_s"], int | float) else 0.0
        ep["gpus"], ep["since"] = gpus, start
        ep["gpu_hours"] = round(len(gpus) * idle_s / 3600, 6)
        episodes.append(ep)
    episodes.sort(key=lambda ep: (not ep["open"], -ep["gpu_hours"], ep["event_id"]))
    totals: dict[tuple[str, str | None, str | None], list[float]] = {}
    for ep in episodes:
        t = totals.setdefault((ep["cluster_id"], ep.get("partition"), ep.get("user")), [0, 0.0, 0])
        t[0] += 1
        t[1] += ep["gpu_hours"]
        t[2] += len(ep["gpus"]) if ep["open"] else 0
    return {
        "window": {"since": since, "until": until},
        "totals": ctx.fit(
            {
                "cluster_id": c,
                "partition": p,
                "user": u,
                "episodes": int(t[0]),
                "gpu_hours": round(t[1], 6),
                "gpus_idle_now": int(t[2]),
            }
            for (c, p, u), t in sorted(totals.items(), key=lambda kv: -kv[1][1])
        ),
        "episodes": ctx.fit(episodes[: row_limit(args, ctx)]),
    }


@question(
    "drains",
    "Drain history: nodes drained, resumed, or drains skipped (and why)",
    (P_CLUSTER, P_NODE, P_SINCE, P_UNTIL, P_LAST, P_LIMIT),
    answer_schema({"window": WINDOW, "drains": list_of(EVENT)}),
)
def drains(conn: sqlite3.Connection, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    where, params = scope(ctx, args)
    since, until = window(args, ctx)
    if args.get("node_id") is not None:
        where += " AND node_id = ?"
        params.append(args["node_id"])
    rows = conn.execute(
        f"SELECT {EVENT_COLUMNS} FROM events WHERE type IN (?,?,?) AND {where}"
        " AND ts >= ? AND ts <= ? ORDER BY ts DESC, id DESC LIMIT ?",
        [*DRAIN_TYPES, *params, since, until, row_limit(args, ctx)],
    )
    return {
        "window": {"since": since, "until": until},
        "drains": ctx.fit(event_row(r) for r in rows),
    }
