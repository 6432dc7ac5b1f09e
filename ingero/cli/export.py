"""``ingero export``: a timeline for ui.perfetto.dev and chrome://tracing."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ingero.cli.options import explicit, fanout_from, fanout_options, node_db_option, seconds
from ingero.fanout.remote import DEFAULT_LIMIT, DEFAULT_SINCE
from ingero.fanout.ssh import no_node_answered
from ingero.runtime.errors import EXIT_OK, UsageError

if TYPE_CHECKING:
    from ingero.fanout.timeline import Slice


@click.command("export")
@node_db_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["perfetto", "chrome"]),
    default="perfetto",
    show_default=True,
    help="Both write Trace Event Format JSON, which both UIs open.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=None,
    help="Write here instead of stdout.",
)
@click.option(
    "--since",
    default=DEFAULT_SINCE,
    show_default=True,
    help="The last stretch of time to export (before --until, or before now with --nodes).",
)
@click.option(
    "--until", default=None, help="End of the export: Unix seconds; default the newest row of --db."
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=DEFAULT_LIMIT,
    show_default=True,
    help="Most rows per table and node (the newest).",
)
@click.option(
    "--node",
    "node_name",
    default=None,
    help="Name of a single node DB's track (default: this host's name).",
)
@click.option(
    "--events",
    "events_file",
    type=click.Path(dir_okay=False, allow_dash=True),
    default=None,
    help="Straggler episodes and drains from saved `journalctl -o json` output ('-': stdin).",
)
@click.option(
    "--journal", is_flag=True, help="Straggler episodes and drains from this host's journal."
)
@fanout_options
@click.pass_context
def export(
    ctx: click.Context,
    db_path: Path,
    fmt: str,
    output: Path | None,
    since: str,
    until: str | None,
    limit: int,
    node_name: str | None,
    events_file: str | None,
    journal: bool,
    nodes: str | None,
    job_nodes: str | None,
    fanout: int,
    node_timeout: str,
    ssh_options: str | None,
    remote_ingero: str,
) -> int:
    """Export a node DB, a merged DB or the nodes (--nodes) as a Perfetto/Chrome timeline.

    One process track per node, a thread track per traced process (rank, PID, comm): the
    sampled CUDA and NCCL calls with their durations, per-interval call rates and host
    counters, straggler episodes and drains as slices (--events, --journal), NCCL
    collectives of one communicator linked. Clock offsets are applied where known (merged
    with --nodes, or judged by shared NCCL collectives) and a warning names nodes whose
    clocks disagree by more than 100 ms. Exit 0, 65/69 for a bad or missing DB, 69 when no
    node answered.
    """
    from ingero.fanout.timeline import build_trace

    since_s = seconds("--since", since, positive=True)
    end: float | None = None
    if until is not None:
        try:
            end = float(until)
        except ValueError:
            raise UsageError(f"--until: expected Unix seconds, got {until!r}") from None
    spread = fanout_from(nodes, job_nodes, fanout, node_timeout, ssh_options, remote_ingero)
    if spread is None:
        from ingero.fanout.sources import read_db

        data, end = read_db(db_path, node_name or socket.gethostname(), since_s, end, limit)
    else:
        from ingero.fanout.remote import fetch_tables
        from ingero.fanout.timeline import NodeData

        if until is not None:
            raise UsageError("--until goes with --db; with --nodes the export ends now")
        remote_db = str(db_path) if explicit(ctx, "db_path") else None
        fetched = fetch_tables(spread, since_s, limit, remote_db)
        for failure in fetched.failed:
            click.echo(f"ingero: {failure['node']}: {failure['error']}", err=True)
        if not fetched.tables:
            raise no_node_answered(fetched.failed)
        data = [
            NodeData(
                node, {t: (c, list(r)) for t, (c, r) in tables.items()}, fetched.offsets.get(node)
            )
            for node, tables in fetched.tables.items()
        ]
    slices: list[Slice] = []
    if events_file is not None or journal:
        slices = _slices(events_file, journal, end, since_s)
    trace, warnings = build_trace(data, slices, fmt)
    for warning in warnings:
        click.echo(f"ingero: warning: {warning}", err=True)
    text = json.dumps(trace, separators=(",", ":"))
    if output is None:
        sys.stdout.write(text + "\n")
    else:
        try:
            output.write_text(text + "\n")
        except OSError as exc:
            raise UsageError(f"{output}: {exc.strerror}") from None
        events = len(trace["traceEvents"])
        click.echo(f"{output}: {events:,} events from {len(data)} node(s)", err=True)
    return EXIT_OK


def _slices(
    events_file: str | None, journal: bool, end: float | None, since_s: float
) -> list[Slice]:
    from ingero.fanout.timeline import slices_from_rows
    from ingero.journal.episodes import EVENT_TYPES, group
    from ingero.journal.journalctl import Journalctl, Query
    from ingero.journal.view import parse_lines

    lines: list[str] = []
    if events_file == "-":
        lines += sys.stdin.readlines()
    elif events_file is not None:
        try:
            lines += Path(events_file).read_text(errors="replace").splitlines()
        except OSError as exc:
            raise UsageError(f"{events_file}: {exc.strerror}") from None
    if journal:
        start = None if end is None else end - since_s
        query = Query(types=EVENT_TYPES, since=None if start is None else f"@{start:.0f}")
        lines += list(Journalctl().lines(query))
    parsed = parse_lines(lines)
    for why in parsed.skipped:
        click.echo(f"ingero export: skipped {why}", err=True)
    return slices_from_rows(group(parsed.events))
