"""Which rank of a job is late in which NCCL collective, the hung collectives with the
stacks that explain them, and the nodes whose clock was off.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from ingero.echo import collectives, stack_snapshots
from ingero.echo.answers.common import (
    LAG_RANK,
    P_CLUSTER,
    P_LAST,
    P_LIMIT,
    P_SINCE,
    P_UNTIL,
    SNAPSHOT,
    SNAPSHOT_STACK,
    WINDOW,
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


@question(
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
)
def collective_lag(conn: sqlite3.Connection, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Which rank of a job is late, in which collective: its ranks ranked by NCCL entry lag,
    its hung collectives, and the clocks of its nodes that were off (which makes lag
    figures from them doubtful)."""
    answer = job_lag(conn, ctx, args)
    for key in ("ranks", "hangs", "clock_skew", "stack_snapshots"):
        answer[key] = ctx.fit(answer[key])
    return answer


def job_lag(conn: sqlite3.Connection, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """The answer's lists, each at most ``limit`` long (``job_report`` takes its ranks);
    the byte limit is the caller's to apply."""
    where, params = scope(ctx, args)
    since, until = window(args, ctx)
    job = args["job_id"]
    # by the job index; the helpers add the window
    job_where = f"job_id = ? AND {where}"
    job_params = [job, *params]
    limit = row_limit(args, ctx)
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
