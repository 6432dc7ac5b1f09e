"""What every question shares: the caller's scope, the window, the row limit, an event read
back, the common parameters and answer schemas, and ``question``, which registers a
question beside its function.
"""

from __future__ import annotations

import json
from typing import Any

from ingero.echo.questions import (
    INT,
    INT_N,
    NUM,
    NUM_N,
    STR,
    STR_N,
    Context,
    Param,
    Registry,
    list_of,
    obj,
)
from ingero.echo.rows import COLUMNS
from ingero.runtime.config import parse_duration

# Every question, registered by ``question`` beside its function; ``ingero.echo.answers``
# lists them in their order.
REGISTRY = Registry()
question = REGISTRY.question


# -- helpers ---------------------------------------------------------------------------------


def scope(ctx: Context, args: dict[str, Any], column: str = "cluster_id") -> tuple[str, list[Any]]:
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


def window(args: dict[str, Any], ctx: Context) -> tuple[float, float]:
    until = args.get("until")
    since = args.get("since")
    until_f = float(until) if until is not None else ctx.now
    if since is not None:
        return float(since), until_f
    last = parse_duration(args["last"]) if args.get("last") else 7 * 86400.0
    return until_f - last, until_f


def row_limit(args: dict[str, Any], ctx: Context) -> int:
    return min(int(args.get("limit") or ctx.max_rows), ctx.max_rows)


# The columns an event is read back with (all it is stored with but ``received``), named:
# a row is read back by these names.
_EVENT_FIELDS = tuple(column for column in COLUMNS if column != "received")
EVENT_COLUMNS = ", ".join(_EVENT_FIELDS)


def event_row(row: tuple[Any, ...]) -> dict[str, Any]:
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


DRAIN_TYPES = ("node_drained", "node_resumed", "drain_skipped")
