"""The merged DB (``ingero merge``): many node DBs in one queryable database, with node, job
and rank on every row. This module is its writer, and the reader of its own table.

The merged database has the node DB's tables (``intervals``, ``raw_events``,
``host_intervals``, ``gpu_intervals``, ``gpu_processes``, ``processes``, and from node DB v3
``nccl_calls`` and ``nccl_comms``: present once a node that has them is merged, a node DB
without them adds no rows there), each with a leading ``node`` column
and ``job_id``/``rank`` columns, plus ``merged_nodes`` (one row per node: where its rows came
from, its schema version and clock offset where measured). Rows of the node-wide tables
(host and GPU intervals) get the node's job and rank when the node ran exactly one job
rank, else NULL. Merging a node again replaces its rows in one transaction, so re-running
a merge gives the same database. Its ``user_version`` is the node DB schema version of its
contents: ``ingero query --db OUT.db`` reads it like a node DB, and a node DB or merged DB
from a newer ingero is refused.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import sqlite_utils

from ingero.nodedb.schema import SCHEMA_VERSION, open_node_db
from ingero.nodedb.tables import CARRIED_TABLES
from ingero.runtime.errors import EXIT_DATAERR, IngeroError

MERGED_TABLE: Final = "merged_nodes"
# Tables whose rows are node-wide: they get the node's job and rank where it has one.
NODE_WIDE: Final = ("host_intervals", "gpu_intervals")


class MergeError(IngeroError):
    """An input or the output is not something this ingero can merge."""

    exit_code = EXIT_DATAERR


@dataclass(frozen=True)
class NodeInput:
    node: str
    path: Path


def parse_inputs(args: Sequence[str]) -> list[NodeInput]:
    """``NODE=PATH`` or ``PATH`` (the node is then the file name without its suffix)."""
    out: list[NodeInput] = []
    for arg in args:
        node, sep, path = arg.partition("=")
        item = NodeInput(node, Path(path)) if sep and node else NodeInput(Path(arg).stem, Path(arg))
        if any(i.node == item.node for i in out):
            raise MergeError(f"{arg}: node {item.node!r} given twice (name them NODE=PATH)")
        out.append(item)
    return out


def open_output(path: Path) -> sqlite_utils.Database:
    """The merged database, created when missing; refused when not one or from a newer ingero."""
    if path.exists() and path.is_dir():
        raise MergeError(f"{path}: is a directory")
    fresh = not path.exists() or path.stat().st_size == 0
    try:
        conn = sqlite3.connect(str(path))
        db = sqlite_utils.Database(conn)
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        tables = set(db.table_names())
    except sqlite3.Error as exc:
        raise MergeError(f"{path}: not a SQLite database ({exc})") from None
    if version > SCHEMA_VERSION:
        conn.close()
        raise MergeError(
            f"{path}: schema version {version} is newer than this ingero ({SCHEMA_VERSION});"
            " merge with a newer ingero"
        )
    if not fresh and tables and MERGED_TABLE not in tables:
        conn.close()
        raise MergeError(f"{path}: exists and is not a merged database (no {MERGED_TABLE} table)")
    db.execute("PRAGMA journal_mode=WAL")
    if MERGED_TABLE not in tables:
        with conn:
            db.table(MERGED_TABLE).create(
                {
                    "node": str,
                    "source": str,
                    "schema_version": int,
                    "job_id": str,
                    "rank": int,
                    "clock_offset_s": float,
                    "merged_at": float,
                },
                pk="node",
            )
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    return db


def _ensure_table(out: sqlite_utils.Database, table: str, columns: Sequence[str]) -> None:
    """Create ``table`` (node, job_id, rank first) or add the columns it lacks."""
    # Types follow the node schema where it has the column; new columns (a newer node
    # schema) are added untyped, so SQLite keeps each value's own type.
    have = [c.name for c in out.table(table).columns] if out.table(table).exists() else []
    wanted = ["node", "job_id", "rank", *[c for c in columns if c not in ("job_id", "rank")]]
    if not have:
        cols = ", ".join(f'"{c}"' for c in wanted)
        out.execute(f'CREATE TABLE "{table}" ({cols})')
        out.execute(f'CREATE INDEX "{table}_node" ON "{table}" (node)')
        return
    for col in wanted:
        if col not in have:
            out.execute(f'ALTER TABLE "{table}" ADD COLUMN "{col}"')


def _node_job(rows: Iterable[tuple[Any, Any]]) -> tuple[str | None, int | None]:
    pairs = {(j, r) for j, r in rows if j is not None}
    if len(pairs) != 1:
        return None, None
    job, rank = next(iter(pairs))
    return str(job), None if rank is None else int(rank)


def merge_rows(
    out: sqlite_utils.Database,
    node: str,
    tables: Mapping[str, tuple[Sequence[str], Iterable[Sequence[Any]]]],
    *,
    source: str,
    schema_version: int | None,
    clock_offset_s: float | None = None,
    now: float | None = None,
) -> int:
    """Replace ``node``'s rows with ``tables`` (name -> (columns, rows)); returns rows written."""
    if schema_version is not None and schema_version > SCHEMA_VERSION:
        raise MergeError(
            f"{source}: node DB schema version {schema_version} is newer than this ingero"
            f" ({SCHEMA_VERSION}); merge with a newer ingero"
        )
    # The processes table is small (one row per traced process): read it first for the job
    # and rank of the node-wide rows; every other table is streamed.
    tables = dict(tables)
    job, rank = (None, None)
    if "processes" in tables:
        cols, rows = tables["processes"]
        procs = [tuple(r) for r in rows]
        tables["processes"] = (cols, procs)
        if "job_id" in cols and "rank" in cols:
            j, r = list(cols).index("job_id"), list(cols).index("rank")
            job, rank = _node_job((row[j], row[r]) for row in procs)
    written = 0
    with out.conn:
        for table in CARRIED_TABLES:
            if out.table(table).exists():
                out.execute(f'DELETE FROM "{table}" WHERE node = ?', [node])
        for table, (columns, rows) in tables.items():
            if table not in CARRIED_TABLES:
                continue
            _ensure_table(out, table, columns)
            names = ["node", *columns]
            extra: tuple[Any, ...] = ()
            if table in NODE_WIDE:
                names += ["job_id", "rank"]
                extra = (job, rank)
            marks = ", ".join("?" * len(names))
            quoted = ", ".join(f'"{c}"' for c in names)
            cur = out.conn.executemany(
                f'INSERT INTO "{table}" ({quoted}) VALUES ({marks})',
                ((node, *row, *extra) for row in rows),
            )
            written += max(cur.rowcount, 0)
        out.table(MERGED_TABLE).upsert(
            {
                "node": node,
                "source": source,
                "schema_version": schema_version,
                "job_id": job,
                "rank": rank,
                "clock_offset_s": clock_offset_s,
                "merged_at": time.time() if now is None else now,
            },
            pk="node",
        )
    return written


def merge_node_db(out: sqlite_utils.Database, node: str, path: Path) -> int:
    """Merge one node DB file (read-only, streamed in batches) as ``node``."""
    src = open_node_db(path)
    try:
        version = int(src.execute("PRAGMA user_version").fetchone()[0])
        tables = {}
        present = set(src.table_names())
        for table in CARRIED_TABLES:
            if table not in present:  # an older node DB (no NCCL tables before v3)
                continue
            cur = src.conn.execute(f'SELECT * FROM "{table}"')
            tables[table] = ([d[0] for d in cur.description], _batches(cur))
        return merge_rows(out, node, tables, source=str(path), schema_version=version)
    finally:
        src.conn.close()


def _batches(cur: sqlite3.Cursor, size: int = 5000) -> Iterable[tuple[Any, ...]]:
    while rows := cur.fetchmany(size):
        yield from rows


def node_names(conn: sqlite3.Connection) -> list[str]:
    """The nodes a merged DB holds, by name."""
    return [str(r[0]) for r in conn.execute(f"SELECT node FROM {MERGED_TABLE} ORDER BY node")]


def clock_offsets(conn: sqlite3.Connection) -> dict[Any, Any]:
    """Each merged node's measured clock offset (None where none was measured)."""
    return dict(conn.execute(f"SELECT node, clock_offset_s FROM {MERGED_TABLE}").fetchall())


def check_node_db(path: Path) -> None:
    """Open (and close) a node DB: a missing or newer one fails before anything is written."""
    open_node_db(path).conn.close()
