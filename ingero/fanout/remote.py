"""Read node DBs over SSH for ``merge --nodes`` and ``export --nodes``.

Each table's newest rows of the last ``since`` seconds (at most ``limit``) come from
``ingero query --json --table T`` on every node, so the node's read-only guard applies;
a node that fails any table is left out whole (a node is merged completely or not at all),
except that a node whose ingero refuses an optional table (``nccl_calls``/``nccl_comms``:
its node DB is older than v3, or its ingero is) gives no rows of it.
Clock offsets are measured in the same run (``ssh.clock_offsets``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Final

from ingero.fanout.ssh import (
    COMMAND_NOT_FOUND,
    Fanout,
    NodeResult,
    clock_offsets,
    remote_json,
    run_on_nodes,
)
from ingero.nodedb.tables import CARRIED_TABLES, OPTIONAL_TABLES

# Rows come over SSH as JSON held in memory: bounded by time and count (merge, export).
DEFAULT_SINCE: Final = "15m"
DEFAULT_LIMIT: Final = 200_000
# A remote query of a large table needs longer than an interactive one.
REMOTE_QUERY_TIMEOUT: Final = "60s"


@dataclass
class Fetched:
    tables: dict[str, dict[str, tuple[list[str], list[list[Any]]]]] = field(default_factory=dict)
    failed: list[dict[str, Any]] = field(default_factory=list)
    truncated: list[tuple[str, str]] = field(default_factory=list)  # (node, table)
    offsets: dict[str, float] = field(default_factory=dict)


def fetch_tables(spread: Fanout, since_s: float, limit: int, remote_db: str | None) -> Fetched:
    options = spread.options
    out = Fetched()
    nodes = list(spread.nodes)
    db = ["--db", remote_db] if remote_db else []
    for table in CARRIED_TABLES:
        if not nodes:
            break
        argv = [
            options.remote_ingero,
            "query",
            "--json",
            "--table",
            table,
            "--since",
            f"{math.ceil(since_s)}s",
            "--limit",
            str(limit),
            "--timeout",
            REMOTE_QUERY_TIMEOUT,
            *db,
        ]
        for r in run_on_nodes(nodes, argv, options):
            answer = remote_json(r) if r.ok else None
            if answer is None or not isinstance(answer.get("columns"), list):
                if table in OPTIONAL_TABLES and refused(r):
                    continue
                failure = r.as_failure(options.node_timeout_s)
                failure["error"] = f"{table}: {failure['error']}"
                out.failed.append(failure)
                out.tables.pop(r.node, None)
                nodes.remove(r.node)
                continue
            cols = [str(c) for c in answer["columns"]]
            out.tables.setdefault(r.node, {})[table] = (cols, list(answer.get("rows") or []))
            if answer.get("truncated"):
                out.truncated.append((r.node, table))
    out.offsets = clock_offsets(list(out.tables), options) if out.tables else {}
    return out


def refused(result: NodeResult) -> bool:
    """The node's ingero ran and said no (no such table, an unknown --table): not a node
    that could not be reached, timed out or has no ingero."""
    return result.reachable and result.rc not in (0, COMMAND_NOT_FOUND)
