"""The questions Echo answers, each implemented once and described once.

Every question is a ``Question``: its parameters (validated here, so the HTTP API and MCP
reject the same bad input with the same message), a JSON Schema of its answer (used for
the OpenAPI document and MCP tool descriptions) and a function over a read-only SQLite
connection. Every function filters by the caller's ``Principal``: a tenant never sees a
row of a cluster outside its token's scope.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import yaml

from ingero.config import parse_duration
from ingero.echo.auth import Principal
from ingero.echo.schema import EVENTS_BY_CLUSTER
from ingero.errors import ConfigError
from ingero.sqlguard import TRUNCATED_REASONS, ByteBudget

T = TypeVar("T")


class BadRequest(ValueError):
    """A question's parameters are missing, unknown or of the wrong type."""


@dataclass(frozen=True)
class Param:
    name: str
    type: str  # JSON Schema type: string | number | integer
    description: str
    required: bool = False
    default: Any = None
    enum: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    max_length: int = 256  # ids and names; the SQL text allows more
    pattern: str | None = None

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "description": self.description}
        if self.type == "string":
            out.update(minLength=1, maxLength=self.max_length)
            if self.pattern:
                out["pattern"] = self.pattern
        if self.default is not None:
            out["default"] = self.default
        if self.enum:
            out["enum"] = list(self.enum)
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        return out

    def parse(self, value: Any) -> Any:
        """Coerce a query-string or JSON value; raises BadRequest naming the parameter."""
        if self.type == "string":
            if not isinstance(value, str) or not value:
                raise BadRequest(f"parameter {self.name} must be a non-empty string")
            if len(value) > self.max_length:
                raise BadRequest(
                    f"parameter {self.name} is longer than {self.max_length} characters"
                )
            if self.enum and value not in self.enum:
                raise BadRequest(f"parameter {self.name} must be one of {', '.join(self.enum)}")
            if self.pattern and not re.search(self.pattern, value):
                raise BadRequest(f"parameter {self.name} must look like 24h, 30m or 7d")
            return value
        number: float | int
        try:
            if isinstance(value, bool):
                raise ValueError
            if self.type == "integer":
                number = int(value) if isinstance(value, int | str) else _int_float(value)
            else:
                number = float(value)
        except (TypeError, ValueError):
            raise BadRequest(
                f"parameter {self.name} must be a{'n integer' if self.type == 'integer' else ' number'}"
            ) from None
        if isinstance(number, float) and not math.isfinite(number):
            raise BadRequest(f"parameter {self.name} must be finite")
        if self.minimum is not None and number < self.minimum:
            raise BadRequest(f"parameter {self.name} must be at least {self.minimum:g}")
        if self.maximum is not None and number > self.maximum:
            raise BadRequest(f"parameter {self.name} must be at most {self.maximum:g}")
        return number


def _int_float(value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise ValueError


@dataclass
class Context:
    """What a question needs besides its parameters."""

    principal: Principal
    now: float
    rates: GpuRates
    max_rows: int = 1000
    # Counts the answer's lists as JSON while they are built (unlimited by default).
    budget: ByteBudget = field(default_factory=lambda: ByteBudget(None))

    def fit(self, items: Iterable[T]) -> list[T]:
        """The items of one of the answer's lists that fit its byte limit, read lazily (an
        event's ``extra`` can be large: rows past the limit are never fetched)."""
        return self.budget.take(items)


@dataclass(frozen=True)
class Question:
    name: str
    summary: str
    params: tuple[Param, ...]
    output: dict[str, Any]
    run: Callable[[sqlite3.Connection, Context, dict[str, Any]], dict[str, Any]]

    def parse(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        known = {p.name: p for p in self.params}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise BadRequest(
                f"unknown parameter {unknown[0]!r} (known: {', '.join(known) or 'none'})"
            )
        args: dict[str, Any] = {}
        for p in self.params:
            value = raw.get(p.name)
            if value is None:
                if p.required:
                    raise BadRequest(f"parameter {p.name} is required")
                args[p.name] = p.default
            else:
                args[p.name] = p.parse(value)
        since, until = args.get("since"), args.get("until")
        if since is not None and until is not None and since > until:
            raise BadRequest("since must not be after until")
        if since is not None and args.get("last") is not None:
            raise BadRequest("give since or last, not both")
        return args

    def input_schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {p.name: p.schema() for p in self.params},
            "required": [p.name for p in self.params if p.required],
            "additionalProperties": False,
        }


# -- GPU rates -------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuRates:
    """Hourly price per GPU model; models match by case-insensitive substring, longest first."""

    currency: str
    default: float
    models: dict[str, float] = field(default_factory=dict)

    def rate(self, gpu_model: str | None) -> float:
        if gpu_model:
            low = gpu_model.lower()
            for model in sorted(self.models, key=len, reverse=True):
                if model.lower() in low:
                    return self.models[model]
        return self.default

    @classmethod
    def parse(cls, raw: Any, source: str) -> GpuRates:
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: expected a mapping with currency, default, models")
        unknown = set(raw) - {"currency", "default", "models"}
        if unknown:
            raise ConfigError(f"{source}: unknown key {sorted(unknown)[0]!r}")
        currency = raw.get("currency", "USD")
        default = raw.get("default", 0.0)
        models = raw.get("models") or {}
        if not isinstance(currency, str) or not isinstance(models, dict):
            raise ConfigError(f"{source}: currency must be a string and models a mapping")
        for key, value in [("default", default), *models.items()]:
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigError(f"{source}: rate {key} must be a number >= 0, got {value!r}")
        return cls(currency, float(default), {str(k): float(v) for k, v in models.items()})

    @classmethod
    def load(cls, override: str | None = None) -> GpuRates:
        """The shipped table, with ``override`` (a file of the same format) laid over it.

        An override in another currency replaces the table instead: mixing its prices with
        the shipped ones would label dollars as euros."""
        shipped = yaml.safe_load(
            resources.files("ingero.echo").joinpath("data/gpu_rates.yaml").read_text()
        )
        base = cls.parse(shipped, "gpu_rates.yaml")
        if override is None:
            return base
        try:
            raw = yaml.safe_load(Path(override).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{override}: cannot read GPU rates: {exc}") from None
        mine = cls.parse(raw, override)
        if mine.currency != base.currency:
            return mine
        return cls(
            base.currency,
            mine.default if "default" in raw else base.default,
            {**base.models, **mine.models},
        )


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


_EVENT_COLUMNS = (
    "event_id, type, cluster_id, node_id, job_id, rank, score, threshold, detection_mode,"
    " dominant_signal, ts, extra"
)


def _event_row(row: tuple[Any, ...]) -> dict[str, Any]:
    keys = [c.strip() for c in _EVENT_COLUMNS.split(",")]
    out = dict(zip(keys, row, strict=True))
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

NUM = {"type": "number"}
NUM_N = {"type": ["number", "null"]}
STR = {"type": "string"}
STR_N = {"type": ["string", "null"]}
INT = {"type": "integer"}
INT_N = {"type": ["integer", "null"]}
WINDOW = {
    "type": "object",
    "properties": {"since": NUM, "until": NUM},
    "required": ["since", "until"],
}


# The two fields every answer (SQL and questions) ends with.
TRUNCATION_SCHEMA: dict[str, Any] = {
    "truncated": {"type": "boolean"},
    "truncated_reason": {
        "type": ["string", "null"],
        "enum": [*TRUNCATED_REASONS, None],
        "description": "Why the answer was cut short: rows (the row limit), bytes (the"
        " answer's byte limit) or time (the time limit); null when it is whole",
    },
}


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
    }


def _answer(props: dict[str, Any]) -> dict[str, Any]:
    return _obj({**props, **TRUNCATION_SCHEMA})


def _list(item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": item}


EVENT = _obj(
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
STRAGGLER = _obj(
    {
        "cluster_id": STR,
        "node_id": STR,
        "seconds_below": NUM,
        "max_depth": NUM_N,
        "episodes": INT,
        "open": {"type": "boolean"},
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
    return {
        "window": {"since": since, "until": until},
        "order_by": args.get("order_by") or "time",
        "stragglers": [
            {
                "cluster_id": c,
                "node_id": n,
                "seconds_below": max(0.0, float(s)),
                "max_depth": d,
                "episodes": e,
                "open": bool(o),
                "last_seen": last,
            }
            for c, n, s, d, e, o, last in rows
        ],
    }


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


QUESTIONS: dict[str, Question] = {
    q.name: q
    for q in [
        Question(
            "summary",
            "Cluster summary: nodes, events, drains and straggler episodes per cluster",
            (P_CLUSTER, P_SINCE, P_UNTIL, P_LAST),
            _answer(
                {
                    "window": WINDOW,
                    "clusters": _list(
                        _obj(
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
            _answer({"window": WINDOW, "order_by": STR, "stragglers": _list(STRAGGLER)}),
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
            _answer(
                {
                    "window": WINDOW,
                    "outliers": _list(
                        _obj(
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
            _answer({"window": WINDOW, "events": _list(EVENT)}),
            events,
        ),
        Question(
            "job_report",
            "Everything about one Slurm job: nodes, event counts, stragglers, drains,"
            " NCCL peer-lag events and job summaries",
            (Param("job_id", "string", "Slurm job id", required=True), P_CLUSTER),
            _answer(
                {
                    "job_id": STR,
                    "found": {"type": "boolean"},
                    "first_event": NUM_N,
                    "last_event": NUM_N,
                    "event_counts": {"type": "object", "additionalProperties": INT},
                    "nodes": _list(_obj({"cluster_id": STR, "node_id": STR, "events": INT})),
                    "stragglers": _list(STRAGGLER),
                    "drains": _list(EVENT),
                    "summaries": _list(EVENT),
                    "peer_lag": _list(EVENT),
                }
            ),
            job_report,
        ),
        Question(
            "drains",
            "Drain history: nodes drained, resumed, or drains skipped (and why)",
            (P_CLUSTER, P_NODE, P_SINCE, P_UNTIL, P_LAST, P_LIMIT),
            _answer({"window": WINDOW, "drains": _list(EVENT)}),
            drains,
        ),
        Question(
            "cost",
            "Cost of straggling: GPU-hours lost x the hourly rate of each node's GPU model",
            (P_CLUSTER, P_JOB, P_SINCE, P_UNTIL, P_LAST, P_LIMIT),
            _answer(
                {
                    "window": WINDOW,
                    "currency": STR,
                    "total_gpu_hours_lost": NUM,
                    "total_cost": NUM,
                    "nodes": _list(
                        _obj(
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
                    "notes": _list(STR),
                }
            ),
            cost,
        ),
    ]
}
