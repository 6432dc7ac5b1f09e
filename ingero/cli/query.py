"""``ingero query``: read-only, bounded SQL against the node DB."""

from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path

import click

from ingero.cli.options import node_db_option, seconds
from ingero.errors import EXIT_DATAERR, EXIT_OK, IngeroError, UsageError
from ingero.explain.reader import NODE_TABLES

# The column each table's rows are placed in time by, for --since and newest-first order.
TIME_COLUMNS = {
    "intervals": "ts_end",
    "raw_events": "ts",
    "host_intervals": "ts_end",
    "gpu_intervals": "ts_end",
    "gpu_processes": "ts_end",
    "processes": "last_seen",
}


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
@click.option("--since", default=None, help="With --table: only rows of the last 10m, 1h, ….")
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
def query(sql: str | None, db_path: Path, table: str | None, since: str | None, limit: int,
          timeout: str, as_json: bool, as_csv: bool) -> int:  # fmt: skip
    """Run one read-only SQL statement (or --table) against the node DB.

    Tables: intervals, raw_events, host_intervals, gpu_intervals, gpu_processes, processes (see
    docs/explain.md). Writes, ATTACH, PRAGMA and extensions are refused; a query stops at
    --limit rows and after --timeout. Exit 0, 65 for a refused or failed query, 69 when the
    node DB is missing.
    """
    from ingero.explain.reader import open_node_db
    from ingero.sqlguard import SqlError, read_only_authorizer, run_bounded

    if as_json and as_csv:
        raise UsageError("--json and --csv: pick one")
    if (sql is None) == (table is None):
        raise UsageError("give either an SQL statement or --table")
    if since is not None and table is None:
        raise UsageError("--since goes with --table (in SQL, filter on ts_end or ts)")
    timeout_s = seconds("--timeout", timeout)
    params: tuple[float | int, ...] = ()
    if table is not None:
        column = TIME_COLUMNS[table]
        where = ""
        if since is not None:
            where = f" WHERE {column} > ?"
            params = (time.time() - seconds("--since", since),)
        sql = f"SELECT * FROM {table}{where} ORDER BY {column} DESC LIMIT ?"
        params = (*params, limit)
    assert sql is not None
    db = open_node_db(db_path)
    try:
        result = run_bounded(
            db.conn,
            sql,
            read_only_authorizer(NODE_TABLES),
            max_rows=limit,
            timeout=timeout_s,
            refused_hint="ingero query is read-only and limited to the node DB's tables",
            params=params,
        )
    except SqlError as exc:
        raise QueryError(str(exc)) from None
    finally:
        db.conn.close()
    _output(result.columns, result.rows, truncated=result.truncated, as_json=as_json, as_csv=as_csv)
    if result.truncated:
        click.echo(f"ingero: stopped at {limit} rows (raise --limit for more)", err=True)
    return EXIT_OK


def _output(
    columns: list[str],
    rows: list[tuple[object, ...]],
    *,
    truncated: bool,
    as_json: bool,
    as_csv: bool,
) -> None:
    from ingero.sqlguard import json_value

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
