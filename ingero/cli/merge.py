"""``ingero merge``: node DBs (files, or read from the nodes over SSH) in one queryable DB."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from ingero.cli.options import explicit, fanout_from, fanout_options, node_db_option, seconds
from ingero.fanout.remote import DEFAULT_LIMIT, DEFAULT_SINCE
from ingero.fanout.ssh import no_node_answered
from ingero.runtime.errors import EXIT_OK, UsageError

if TYPE_CHECKING:
    from ingero.fanout.remote import Fetched


@click.command("merge")
@click.argument("out", type=click.Path(path_type=Path))
@click.argument("inputs", nargs=-1)
@node_db_option
@click.option(
    "--since",
    default=DEFAULT_SINCE,
    show_default=True,
    help="With --nodes: the rows of this last stretch of time.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=DEFAULT_LIMIT,
    show_default=True,
    help="With --nodes: most rows per table and node (newest first).",
)
@fanout_options
@click.pass_context
def merge(ctx: click.Context, out: Path, inputs: tuple[str, ...], db_path: Path, since: str,
          limit: int, nodes: str | None, job_nodes: str | None, fanout: int, node_timeout: str,
          ssh_options: str | None, remote_ingero: str) -> int:  # fmt: skip
    """Merge node DBs into OUT.db, with node, job and rank on every row.

    INPUTS are node DB files, as NODE=PATH or PATH (the node is then the file name without
    its suffix); or --nodes/--job-nodes reads each node's DB over SSH (`ingero query` there,
    the last --since, at most --limit rows per table) and measures its clock offset. A node
    merged again replaces its rows, so re-running is safe. Exit 0, 65 when an input or OUT
    is not a node DB or merged DB this ingero can read (written by a newer one, say), 69
    when an input is missing or no node answered.
    """
    from ingero.nodedb.merged import check_node_db, merge_node_db, open_output, parse_inputs

    spread = fanout_from(nodes, job_nodes, fanout, node_timeout, ssh_options, remote_ingero)
    if spread is None and not inputs:
        raise UsageError("give node DB files, --nodes or --job-nodes")
    if spread is not None and inputs:
        raise UsageError("node DB files or --nodes/--job-nodes: pick one")
    if spread is None:
        items = parse_inputs(inputs)
        for item in items:  # every input is checked before anything is written
            check_node_db(item.path)
        db = open_output(out)
        try:
            for item in items:
                rows = merge_node_db(db, item.node, item.path)
                click.echo(f"{item.node}: {rows:,} rows from {item.path}", err=True)
        finally:
            db.conn.close()
        return EXIT_OK
    from ingero.fanout.remote import fetch_tables

    window = seconds("--since", since, positive=True)
    remote_db = str(db_path) if explicit(ctx, "db_path") else None
    fetched = fetch_tables(spread, window, limit, remote_db)
    for failure in fetched.failed:
        click.echo(f"ingero: {failure['node']}: {failure['error']}", err=True)
    if not fetched.tables:
        raise no_node_answered(fetched.failed)
    _write(out, fetched)
    return EXIT_OK


def _write(out: Path, fetched: Fetched) -> None:
    from ingero.nodedb.merged import merge_rows, open_output

    db = open_output(out)
    try:
        for node, tables in fetched.tables.items():
            rows = merge_rows(
                db,
                node,
                tables,
                source=f"ssh://{node}",
                schema_version=None,  # not told over SSH; the node's own ingero read the DB
                clock_offset_s=fetched.offsets.get(node),
            )
            click.echo(f"{node}: {rows:,} rows over SSH", err=True)
        for node, table in fetched.truncated:
            click.echo(f"ingero: {node}: {table} stopped at the --limit newest rows", err=True)
    finally:
        db.conn.close()
