"""Where ``ingero export`` reads its rows: a node DB, a merged DB, or the nodes over SSH."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ingero.fanout.timeline import NodeData
from ingero.nodedb import merged as merged_db
from ingero.nodedb.intervals import latest_ts
from ingero.nodedb.schema import open_node_db
from ingero.nodedb.stacks import stack_rows
from ingero.nodedb.tables import CARRIED_TABLES, window_rows


def read_db(
    path: Path, node: str, since_s: float, until: float | None, limit: int
) -> tuple[list[NodeData], float | None]:
    """Rows of ``(end - since_s, end]`` (``end``: ``until`` or the newest row), per node.

    A merged DB (``ingero merge``) gives one ``NodeData`` per node with its measured clock
    offset; a node DB gives one, named ``node``. At most ``limit`` rows per table and node,
    the newest. Returns the nodes and the window's end.
    """
    db = open_node_db(path)
    conn = db.conn
    try:
        merged = merged_db.MERGED_TABLE in db.table_names()
        end = until if until is not None else latest_ts(db)
        if end is None:
            return [], None
        start = end - since_s
        names = merged_db.node_names(conn) if merged else [node]
        offsets = merged_db.clock_offsets(conn) if merged else {}
        present = set(db.table_names())  # no NCCL tables in a node DB before v3
        out = []
        for name in names:
            data = NodeData(name, clock_offset_s=offsets.get(name))
            for table in (t for t in CARRIED_TABLES if t in present and t != "stacks"):
                cur = window_rows(conn, table, name if merged else None, start, end, limit)
                data.tables[table] = ([d[0] for d in cur.description], cur.fetchall())
            if "stacks" in present:  # node DB v4: the stacks the rows read refer to
                data.tables["stacks"] = _stacks(conn, data, name if merged else None)
            out.append(data)
        return out, end
    finally:
        conn.close()


def _stacks(
    conn: sqlite3.Connection, data: NodeData, node: str | None
) -> tuple[list[str], list[Sequence[Any]]]:
    """The ``stacks`` rows the node's sampled calls refer to (not the table's newest)."""
    keys = {
        str(r["stack_key"])
        for t in ("raw_events", "nccl_calls")
        for r in data.rows(t)
        if r.get("stack_key") is not None
    }
    columns, rows = stack_rows(conn, keys, node)
    return columns, list(rows)
