"""The questions Echo answers, each implemented once and described once (the framework:
``ingero.echo.questions``).

Every function filters by the caller's ``Principal``: a tenant never sees a row of a
cluster outside its token's scope.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
from typing import Any

from ingero.echo import collectives, stack_snapshots
from ingero.echo.questions import (
    INT,
    INT_N,
    NUM,
    NUM_N,
    STR,
    STR_N,
    Context,
    Param,
    Question,
    answer_schema,
    list_of,
    obj,
)
from ingero.echo.rows import COLUMNS
from ingero.echo.schema import EVENTS_BY_CLUSTER
from ingero.runtime.config import parse_duration

# -- helpers ---------------------------------------------------------------------------------


def _scope(ctx: Context, args: dict[str, Any], column: str = "cluster_id") -> tuple[str, list[Any]]:
    """A WHERE fragment limiting rows to the asked cluster and the caller's scope."""
    ctx.principal.require(args.get("cluster_id"))
    clauses: list[str] = []
    params: list[Any] = []
    if args.get("cluster_id") is not None:
        clauses.append(f"{column} = ?")
        params.append(args["cluster_id"])
    if ctx.principal.clusters is not None:
        allowed = sorted(ctx.principal.clusters)
        clauses.append(f"{column} IN ({','.join('?' * len(allowed))})" if allowed else "0")
        params.extend(allowed)
    return (" AND ".join(clauses) or "1"), params


def _window(args: dict[str, Any], ctx: Context) -> tuple[float, float]:
    until = args.get("until")
    since = args.get("since")
    until_f = float(until) if until is not None else ctx.now
    if since is not None:
        return float(since), until_f
    last = parse_duration(args["last"]) if args.get("last") else 7 * 86400.0
    return until_f - last, until_f


def _limit(args: dict[str, Any], ctx: Context) -> int:
    return min(int(args.get("limit") or ctx.max_rows), ctx.max_rows)


# The columns an event is read back with (all it is stored with but ``received``), named:
# a row is read back by these names.
_EVENT_FIELDS = tuple(column for column in COLUMNS if column != "received")
_EVENT_COLUMNS = ", ".join(_EVENT_FIELDS)


def _event_row(row: tuple[Any, ...]) -> dict[str, Any]:
    out = dict(zip(_EVENT_FIELDS, row, strict=True))
    out["timestamp"] = out.pop("ts")
    extra = out.pop("extra")
    out["extra"] = json.loads(extra) if extra else {}
    return out


# -- common parameters and schemas -----------------------------------------------------------

P_CLUSTER = Param("cluster_id", "string", "Cluster (Slurm ClusterName); default: all allowed")
P_JOB = Param("job_id", "string", "Slurm job id")
P_NODE = Param("node_id", "string", "Node id (Slurm NodeName or host name)")
P_SINCE = Param("since", "number", "Window start, Unix seconds; default: until - 7 days")
P_UNTIL = Param("until", "number", "Window end, Unix seconds; default: now")
P_LAST = Param(
    "last",
    "string",
    "Window length ending at until, e.g. 30m, 24h, 7d (instead of since)",
    max_length=32,
    pattern=r"^[0-9]{1,9}(\.[0-9]{1,6})?(ms|s|m|h|d)$",
)
P_LIMIT = Param("limit", "integer", "Most rows to return", default=50, minimum=1, maximum=10_000)

WINDOW = {
    "type": "object",
    "properties": {"since": NUM, "until": NUM},
    "required": ["since", "until"],
}


EVENT = obj(
    {
        "event_id": STR,
        "type": STR,
        "cluster_id": STR,
        "node_id": STR,
        "job_id": STR_N,
        "rank": INT_N,
        "score": NUM_N,
        "threshold": NUM_N,
        "detection_mode": STR_N,
        "dominant_signal": STR_N,
        "timestamp": NUM,
        "extra": {"type": "object"},
    }
)
STRAGGLER = obj(
    {
        "cluster_id": STR,
        "node_id": STR,
        "seconds_below": NUM,
        "max_depth": NUM_N,
        "episodes": INT,
        "open": {"type": "boolean"},
        "last_seen": NUM,
        "peer_lag_ms": {
            **NUM_N,
            "description": "Worst median NCCL entry lag (ms) of the node's ranks behind their"
            " peers in its peer_lag episodes of the window; null when none",
        },
        "collective_hangs": {
            **INT,
            "description": "Hung-collective episodes of the window naming the node among the"
            " nodes of ranks that never entered the collective",
        },
    }
)

LAG_RANK = obj(
    {
        "cluster_id": STR,
        "comm_hash": STR_N,
        "comm_rank": INT_N,
        "rank": INT_N,
        "node_id": STR,
        "nranks": INT_N,
        "op": STR_N,
        "lag_p50_ms": NUM_N,
        "lag_p95_ms": NUM_N,
        "max_lag_p50_ms": NUM_N,
        "max_lag_p95_ms": NUM_N,
        "times_last": INT_N,
        "times_late": INT_N,
        "collectives": INT_N,
        "peers_wait_p50_ms": NUM_N,
        "bytes": INT_N,
        "episodes": INT,
        "open_episodes": INT,
        "closed_episodes": INT,
        "first_seen": NUM,
        "last_seen": NUM,
    }
)
# One process/thread of a stack snapshot (ingero.schema.stacks, with who it is).
SNAPSHOT_STACK = obj(
    {
        "pid": INT_N,
        "rank": INT_N,
        "thread": STR_N,
        "summary": {
            **STR,
            "description": "The innermost Python frames, e.g. 'read_batch at loader.py:212"
            " ← __next__ at loader.py:18'",
        },
        "frames": list_of({"type": "object"}),
    },
    required=["pid", "rank", "thread", "summary", "frames"],
)
SNAPSHOT = obj(
    {
        "event_id": {**STR, "description": "The episode it belongs to"},
        "cluster_id": STR,
        "node_id": STR,
        "job_id": STR_N,
        "rank": INT_N,
        "timestamp": NUM,
        "trigger": {**STR_N, "description": "collective_hang, peer_lag or stalled"},
        "for_s": {**NUM_N, "description": "How long the rank had been in that state"},
        "stacks": list_of(SNAPSHOT_STACK),
    }
)
HANG_STACK = obj(
    {
        "node_id": STR,
        "role": {
            "type": "string",
            "enum": [stack_snapshots.MISSING, stack_snapshots.WAITING],
            "description": "missing: a rank the collective waits for (the answer);"
            " waiting: context",
        },
        **SNAPSHOT_STACK["properties"],
    },
    required=["node_id", "role", *SNAPSHOT_STACK["required"]],
)
HANG = obj(
    {
        "cluster_id": STR,
        "event_id": STR,
        "comm_hash": STR_N,
        "seq": INT_N,
        "op": STR_N,
        "nranks": INT_N,
        "reason": STR_N,
        "missing_ranks": list_of(INT),
        "missing_nodes": list_of(STR),
        "missing_count": INT_N,
        "node_id": STR_N,
        "inside_ranks": INT_N,
        "inside_for_s": NUM_N,
        "since": NUM,
        "detected": NUM,
        "last_seen": NUM,
        "ended": NUM_N,
        "end_reason": STR_N,
        "open": {"type": "boolean"},
        "answer": {
            **STR_N,
            "description": "Where the missing rank is in its code, from its node's stack"
            " snapshot: 'the job is hung in ncclAllReduce #9001; rank 5 on gpu07 has been in"
            " … for 45 s'; null without one",
        },
        "stacks": list_of(HANG_STACK),
    }
)
SKEWED_NODE = obj(
    {
        "cluster_id": STR,
        "node_id": STR,
        "offset_ms": NUM_N,
        "uncertainty_ms": NUM_N,
        "bound_ms": NUM_N,
        "max_abs_offset_ms": NUM_N,
        "open": {"type": "boolean"},
        "events": INT,
        "first_seen": NUM,
        "last_seen": NUM,
    }
)


# -- the questions ---------------------------------------------------------------------------


def summary(conn: sqlite3.Connection, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    where, params = _scope(ctx, args)
    since, until = _window(args, ctx)
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


def stragglers(conn: sqlite3.Connection, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    answer = _stragglers(conn, ctx, args)
    answer["stragglers"] = ctx.fit(answer["stragglers"])
    return answer


def _stragglers(conn: sqlite3.Connection, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """The ranking whole (``job_report`` and ``cost`` work from it; only answers are cut)."""
    where, params = _scope(ctx, args)
    since, until = _window(args, ctx)
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
    rows = conn.execute(sql, [until, since, *params, until, since, _limit(args, ctx)])
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


def outliers(conn: sqlite3.Connection, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Nodes whose mean score sits far below their cluster's median (robust, MAD-based)."""
    where, params = _scope(ctx, args)
    since, until = _window(args, ctx)
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
        "outliers": ctx.fit(found[: _limit(args, ctx)]),
    }


def events(conn: sqlite3.Connection, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    where, params = _scope(ctx, args)
    since, until = _window(args, ctx)
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
        f"SELECT {_EVENT_COLUMNS} FROM {source} WHERE {where} AND ts >= ? AND ts <= ?"
        " ORDER BY ts DESC, id DESC LIMIT ?",
        [*params, since, until, _limit(args, ctx)],
    )
    return {
        "window": {"since": since, "until": until},
        "events": ctx.fit(_event_row(r) for r in rows),
    }


def idle_gpus(conn: sqlite3.Connection, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """The gpu_idle episodes open in the window (started in it, ended in it, or open
    across it), each folded from its start and end events, and their GPU-hours."""
    where, params = _scope(ctx, args)
    since, until = _window(args, ctx)
    for key in ("job_id", "node_id"):
        if args.get(key) is not None:
            where += f" AND {key} = ?"
            params.append(args[key])
    if args.get("user") is not None:  # both of an episode's events carry it
        where += " AND json_extract(extra, '$.user') = ?"
        params.append(args["user"])
    # An episode in the window: an event of it in the window, or no end before it.
    rows = conn.execute(
        f"SELECT {_EVENT_COLUMNS} FROM events WHERE type = 'gpu_idle' AND {where} AND ts <= ?"
        " AND event_id IN (SELECT event_id FROM events WHERE type = 'gpu_idle'"
        f" AND {where} AND ts <= ? GROUP BY event_id HAVING max(ts) >= ?"
        " OR sum(json_extract(extra, '$.state') = 'end') = 0) ORDER BY ts, id",
        [*params, until, *params, until, since],
    )
    folded: dict[str, dict[str, Any]] = {}
    for row in rows:
        e = _event_row(row)
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
        "episodes": ctx.fit(episodes[: _limit(args, ctx)]),
    }


_DRAIN_TYPES = ("node_drained", "node_resumed", "drain_skipped")


def drains(conn: sqlite3.Connection, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    where, params = _scope(ctx, args)
    since, until = _window(args, ctx)
    if args.get("node_id") is not None:
        where += " AND node_id = ?"
        params.append(args["node_id"])
    rows = conn.execute(
        f"SELECT {_EVENT_COLUMNS} FROM events WHERE type IN (?,?,?) AND {where}"
        " AND ts >= ? AND ts <= ? ORDER BY ts DESC, id DESC LIMIT ?",
        [*_DRAIN_TYPES, *params, since, until, _limit(args, ctx)],
    )
    return {
        "window": {"since": since, "until": until},
        "drains": ctx.fit(_event_row(r) for r in rows),
    }


def job_report(conn: sqlite3.Connection, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    where, params = _scope(ctx, args)
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
    ranked = ctx.fit(_stragglers(conn, ctx, window_args)["stragglers"])

    def of_type(kind: str) -> list[dict[str, Any]]:
        return ctx.fit(
            _event_row(r)
            for r in conn.execute(
                f"SELECT {_EVENT_COLUMNS} FROM events WHERE job_id = ? AND type = ?"
                f" AND {where} ORDER BY ts LIMIT ?",
                [job, kind, *params, ctx.max_rows],
            )
        )

    lag = _collective_lag(conn, ctx, window_args)
    drained = ctx.fit(
        _event_row(r)
        for r in conn.execute(
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE job_id = ? AND type IN (?,?,?)"
            f" AND {where} ORDER BY ts LIMIT ?",
            [job, *_DRAIN_TYPES, *params, ctx.max_rows],
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


def collective_lag(conn: sqlite3.Connection, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Which rank of a job is late, in which collective: its ranks ranked by NCCL entry lag,
    its hung collectives, and the clocks of its nodes that were off (which makes lag
    figures from them doubtful)."""
    answer = _collective_lag(conn, ctx, args)
    for key in ("ranks", "hangs", "clock_skew", "stack_snapshots"):
        answer[key] = ctx.fit(answer[key])
    return answer


def _collective_lag(conn: sqlite3.Connection, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """The answer's lists, each at most ``limit`` long (``job_report`` takes its ranks);
    the byte limit is the caller's to apply."""
    where, params = _scope(ctx, args)
    since, until = _window(args, ctx)
    job = args["job_id"]
    # by the job index; the helpers add the window
    job_where = f"job_id = ? AND {where}"
    job_params = [job, *params]
    limit = _limit(args, ctx)
    ranks = collectives.rank_lag(conn, job_where, job_params, (since, until), limit)
    hangs = collectives.hangs(conn, job_where, job_params, (since, until), limit)
    # clock_skew comes from nodes, which know no job: the job's nodes are those of its events
    skew = collectives.clock_skew(
        conn.execute(
            f"SELECT cluster_id, node_id, ts, extra FROM events WHERE type = ? AND {where}"
            " AND ts >= ? AND ts <= ? AND (cluster_id, node_id) IN"
            f" (SELECT DISTINCT cluster_id, node_id FROM events WHERE job_id = ? AND {where})",
            [collectives.SKEW, *params, since, until, job, *params],
        )
    )[:limit]
    # Each hang with the stack snapshots sent under its id: the missing ranks' are the answer.
    snaps = stack_snapshots.read(conn, job_where, job_params, (since, until), limit)
    hangs = [{**h, **stack_snapshots.explain_hang(h, snaps)} for h in hangs]
    return {
        "job_id": job,
        "window": {"since": since, "until": until},
        "ranks": ranks,
        "hangs": hangs,
        "clock_skew": skew,
        "stack_snapshots": snaps,
    }


def cost(conn: sqlite3.Connection, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """GPU-hours lost while a node straggled (its whole allocation waits) x the model's rate."""
    ranked = _stragglers(conn, ctx, {**args, "order_by": "time", "limit": None})["stragglers"]
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
    since, until = _window(args, ctx)
    notes = ["time below threshold x GPUs of the node x hourly rate of its GPU model"]
    if assumed:
        notes.append(f"{assumed} node(s) with unknown GPU count counted as 1 GPU")
    return {
        "window": {"since": since, "until": until},
        "currency": ctx.rates.currency,
        "total_gpu_hours_lost": sum(r["gpu_hours_lost"] for r in rows),
        "total_cost": sum(r["cost"] for r in rows),
        "nodes": ctx.fit(rows[: _limit(args, ctx)]),
        "notes": notes,
    }


# A job is running while something of it (an event, a score sample) is this recent.
JOB_ACTIVE_S = 300.0
# The job timeline's time axis, at most this many columns (scores, heatmap).
TIMELINE_COLUMNS = 120
# The heatmap's rows: ranks are grouped into at most this many (a 1,000-rank job stays small).
HEATMAP_ROWS = 32


def jobs(conn: sqlite3.Connection, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """The jobs seen in the window, per cluster: running ones (seen within JOB_ACTIVE_S)
    first, then the most recent."""
    where, params = _scope(ctx, args)
    since, until = _window(args, ctx)
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
        "jobs": ctx.fit(ordered[: _limit(args, ctx)]),
    }


def _columns(since: float, until: float, n: int) -> tuple[float, float]:
    """The start and width of ``n`` equal columns over the window (width > 0)."""
    return since, max((until - since) / n, 1e-6)


def job_timeline(conn: sqlite3.Connection, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """One job over time, bounded whatever its size: per node its rank, last score and
    state; the score band of all its nodes and the series of its lowest ones against the
    threshold; straggler episodes and drains; and a heatmap of NCCL entry lag by rank."""
    where, params = _scope(ctx, args)
    job = args["job_id"]
    limit = _limit(args, ctx)
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
        since, until = _window(args, ctx)
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
        _event_row(row)
        for row in conn.execute(
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE type IN (?,?,?) AND {where}"
            " AND ts >= ? AND ts <= ? AND (cluster_id, node_id) IN"
            f" (SELECT DISTINCT cluster_id, node_id FROM events WHERE job_id = ? AND {where})"
            " ORDER BY ts LIMIT ?",
            [*_DRAIN_TYPES, *params, since, until, job, *params, limit],
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


QUESTIONS: dict[str, Question] = {
    q.name: q
    for q in [
        Question(
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
            summary,
        ),
        Question(
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
            stragglers,
        ),
        Question(
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
            outliers,
        ),
        Question(
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
            events,
        ),
        Question(
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
            job_report,
        ),
        Question(
            "collective_lag",
            "Which rank of a job is late, in which NCCL collective: ranks ranked by entry lag"
            " behind their peers, hung collectives (the ranks that never entered, and where"
            " in their code they are, from their stack snapshots), and nodes whose clock was"
            " off",
            (
                Param("job_id", "string", "Slurm job id", required=True),
                P_CLUSTER,
                P_SINCE,
                P_UNTIL,
                P_LAST,
                P_LIMIT,
            ),
            answer_schema(
                {
                    "job_id": STR,
                    "window": WINDOW,
                    "ranks": list_of(LAG_RANK),
                    "hangs": list_of(HANG),
                    "clock_skew": list_of(SKEWED_NODE),
                    "stack_snapshots": list_of(SNAPSHOT),
                }
            ),
            collective_lag,
        ),
        Question(
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
            jobs,
        ),
        Question(
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
                                    "description": "reason of its last straggler_state"
                                    " (stall, peer_lag)",
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
            job_timeline,
        ),
        Question(
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
            idle_gpus,
        ),
        Question(
            "drains",
            "Drain history: nodes drained, resumed, or drains skipped (and why)",
            (P_CLUSTER, P_NODE, P_SINCE, P_UNTIL, P_LAST, P_LIMIT),
            answer_schema({"window": WINDOW, "drains": list_of(EVENT)}),
            drains,
        ),
        Question(
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
            cost,
        ),
    ]
}
