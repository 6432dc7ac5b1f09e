"""``ingero query``: read-only, bounded SQL against the node DB."""

from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path

import click

from ingero.cli.options import (
    explicit,
    fanout_from,
    fanout_options,
    node_db_option,
    seconds,
)
from ingero.fanout.ssh import Fanout
from ingero.nodedb.stacks import SITE_ROWS, SITES_SQL
from ingero.nodedb.tables import QUERY_TABLES, TIME_COLUMNS, newest_sql
from ingero.runtime.errors import EXIT_DATAERR, EXIT_OK, IngeroError, UsageError

# `--sites`: call sites per op (``ingero.nodedb.stacks.SITES_SQL``), from the stacks the
# sampled calls refer to (node DB v4).
SITES_PER_OP = 5


class QueryError(IngeroError):
    """A query refused, stopped or invalid."""

    exit_code = EXIT_DATAERR


@click.command("query")
@click.argument("sql", required=False)
@node_db_option
@click.option(
    "--table",
    type=click.Choice(sorted(TIME_COLUMNS)),
    default=None,
    help="Show the newest rows of this table instead of running SQL.",
)
@click.option(
    "--sites",
    is_flag=True,
    help=f"Show the top {SITES_PER_OP} call sites of each op (sampled calls by stack).",
)
@click.option(
    "--since", default=None, help="With --table or --sites: only rows of the last 10m, 1h, …."
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Most rows returned.",
)
@click.option(
    "--timeout",
    "timeout",
    default="5s",
    show_default=True,
    help="Stop a query running longer than this.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV.")
@fanout_options
@click.pass_context
def query(ctx: click.Context, sql: str | None, db_path: Path, table: str | None,
          sites: bool, since: str | None, limit: int, timeout: str, as_json: bool, as_csv: bool,
          nodes: str | None, job_nodes: str | None, fanout: int, node_timeout: str,
          ssh_options: str | None, remote_ingero: str) -> int:  # fmt: skip
    """Run one read-only SQL statement (or --table) against the node DB.

    Tables: intervals, raw_events, host_intervals, gpu_intervals, gpu_processes, processes,
    nccl_calls, nccl_comms, stacks (see docs/explain.md, docs/trace.md). --sites shows the
    top call sites of each op: sampled calls per stack, the stack named by its innermost
    lines of the job's own code (`where`). Writes, ATTACH, PRAGMA and extensions are
    refused; a query stops at
    --limit rows and after --timeout. With --nodes or --job-nodes the query runs on every
    node over SSH (`ingero query --json` there) and the rows gain a leading `node` column;
    nodes that fail are listed on stderr. Exit 0, 65 for a refused or failed query, 69 when
    the node DB is missing (with --nodes: only when no node answered).
    """
    from ingero.nodedb.schema import open_node_db
    from ingero.nodedb.schema import version as schema_version
    from ingero.sqlite.sqlguard import SqlError, read_only_authorizer, run_bounded

    if as_json and as_csv:
        raise UsageError("--json and --csv: pick one")
    if (sql is not None) + (table is not None) + sites != 1:
        raise UsageError("give one of an SQL statement, --table or --sites")
    if since is not None and table is None and not sites:
        raise UsageError("--since goes with --table or --sites (in SQL, filter on ts_end or ts)")
    timeout_s = seconds("--timeout", timeout)
    spread = fanout_from(nodes, job_nodes, fanout, node_timeout, ssh_options, remote_ingero)
    if spread is not None:
        args = ["query", "--json", "--limit", str(limit), "--timeout", timeout]
        if explicit(ctx, "db_path"):
            args += ["--db", str(db_path)]
        if table is not None or sites:
            args += ["--table", table] if table is not None else ["--sites"]
            args += ["--since", since] if since else []
        return _across(spread, [*args, *([sql] if sql is not None else [])], limit,
                       as_json=as_json, as_csv=as_csv)  # fmt: skip
    params: tuple[float | int, ...] = ()
    if table is not None:
        if since is not None:
            params = (time.time() - seconds("--since", since),)
        sql = newest_sql(table, since is not None)
        params = (*params, limit)
    elif sites:
        start = time.time() - seconds("--since", since) if since is not None else float("-inf")
        sql, params = SITES_SQL, (start, SITE_ROWS, SITES_PER_OP, limit)
    assert sql is not None
    db = open_node_db(db_path)
    try:
        if sites and "stacks" not in db.table_names():
            raise QueryError(
                f"{db_path}: no call stacks in this node DB (schema version"
                f" {schema_version(db)}; stacks are recorded"
                " from version 4 by `ingero trace`)"
            )
        result = run_bounded(
            db.conn,
            sql,
            read_only_authorizer(QUERY_TABLES),
            max_rows=limit,
            timeout=timeout_s,
            refused_hint="ingero query is read-only and limited to the node DB's tables",
            params=params,
        )
    except SqlError as exc:
        raise QueryError(str(exc)) from None
    finally:
        db.conn.close()
    rows = [_named(row) for row in result.rows] if sites else result.rows
    _output(result.columns, rows, truncated=result.truncated, as_json=as_json, as_csv=as_csv)
    if result.truncated:
        click.echo(f"ingero: stopped at {limit} rows (raise --limit for more)", err=True)
    return EXIT_OK


def _named(row: tuple[object, ...]) -> tuple[object, ...]:
    """A --sites row with its stack's frames (the ``where`` column) named in one line."""
    from ingero.explain.callsites import where
    from ingero.schema.stacks import StackError, loads

    try:
        text = where(loads(str(row[6])))
    except StackError as exc:
        text = f"(unreadable stack: {exc})"
    return (*row[:6], text, *row[7:])


def _across(spread: Fanout, args: list[str], limit: int, *, as_json: bool, as_csv: bool) -> int:
    from ingero.fanout.ssh import merge_query_results, no_node_answered, run_on_nodes

    options = spread.options
    results = run_on_nodes(spread.nodes, [options.remote_ingero, *args], options)
    merged = merge_query_results(results, options.node_timeout_s)
    for failure in merged.failed:
        click.echo(f"ingero: {failure['node']}: {failure['error']}", err=True)
    if as_json:
        nodes = {"ok": merged.ok, "failed": merged.failed, "truncated": merged.truncated}
        click.echo(
            json.dumps(
                {
                    "columns": merged.columns,
                    "rows": merged.rows,
                    "row_count": len(merged.rows),
                    "truncated": bool(merged.truncated),
                    "nodes": nodes,
                }
            )
        )
    if not merged.ok:
        # Never fatal while one node answers; when none did, say whether they refused.
        raise no_node_answered(merged.failed)
    if not as_json:
        rows = [tuple(r) for r in merged.rows]
        _output(merged.columns, rows, truncated=False, as_json=False, as_csv=as_csv)
    for node in merged.truncated:
        click.echo(f"ingero: {node}: stopped at {limit} rows (raise --limit for more)", err=True)
    return EXIT_OK


def _output(
    columns: list[str],
    rows: list[tuple[object, ...]],
    *,
    truncated: bool,
    as_json: bool,
    as_csv: bool,
) -> None:
    from ingero.sqlite.sqlguard import json_value

    if as_json:
        click.echo(
            json.dumps(
                {
                    "columns": columns,
                    "rows": [[json_value(v) for v in row] for row in rows],
                    "row_count": len(rows),
                    "truncated": truncated,
                }
            )
        )
        return
    if as_csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(rows)
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table()
    for name in columns:
        table.add_column(Text(name))
    for row in rows:
        table.add_row(*(Text("NULL" if v is None else str(v)) for v in row))
    Console(highlight=False, width=None if sys.stdout.isatty() else 200).print(table)
    click.echo(f"{len(rows)} row{'s' if len(rows) != 1 else ''}", err=True)
