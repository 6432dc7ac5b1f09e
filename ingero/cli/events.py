"""``ingero events``: recent straggler episodes, drains and resumes from the journal."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

import click

from ingero.journal.episodes import EVENT_TYPES, group
from ingero.journal.journalctl import Journalctl, Query
from ingero.journal.view import HEADERS, parse_lines, table_rows, to_json
from ingero.runtime.errors import UsageError


@click.command("events")
@click.option("--node", help="Only this node (INGERO_NODE).")
@click.option("--job", help="Only this Slurm job (INGERO_JOB).")
@click.option("--cluster", help="Only this cluster (INGERO_CLUSTER).")
@click.option(
    "--since", default="-24h", show_default=True, help="journalctl time: '-2h', 'today', a date."
)
@click.option("--until", help="journalctl time; default now.")
@click.option("--unit", help="Only events logged by this systemd unit, e.g. ingero-push.")
@click.option(
    "--directory",
    "-D",
    type=click.Path(file_okay=False, exists=True),
    help="Read journal files from this directory instead of the system journal.",
)
@click.option(
    "--input",
    "input_path",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Read saved `journalctl -o json` output instead ('-' for stdin); --node/--job/--cluster apply, --since/--until do not.",
)
@click.option("--json", "as_json", is_flag=True, help="JSON rows for scripts.")
def events(
    node: str | None,
    job: str | None,
    cluster: str | None,
    since: str,
    until: str | None,
    unit: str | None,
    directory: str | None,
    input_path: str | None,
    as_json: bool,
) -> None:
    """Recent straggler episodes, drains and resumes, per node or job, from the journal."""
    query = Query(
        types=EVENT_TYPES,
        node=node,
        job=job,
        cluster=cluster,
        since=since,
        until=until,
        unit=unit,
        directory=directory,
    )
    lines: Iterable[str]
    lines = _read_input(input_path) if input_path is not None else Journalctl().lines(query)
    parsed = parse_lines(lines)
    picked = [
        e
        for e in parsed.events
        if (node is None or e.node_id == node)
        and (job is None or e.job_id == job)
        and (cluster is None or e.cluster_id == cluster)
    ]
    rows = group(picked)
    for why in parsed.skipped:
        click.echo(f"ingero events: skipped {why}", err=True)
    if as_json:
        click.echo(to_json(rows))
        return
    if not rows:
        click.echo("no straggler episodes, drains or resumes found", err=True)
        return
    _print_table(table_rows(rows))


def _read_input(path: str) -> list[str]:
    if path == "-":
        return sys.stdin.readlines()
    try:
        return Path(path).read_text(errors="replace").splitlines()
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror}") from None


def _print_table(cells: list[list[str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in HEADERS:
        table.add_column(name, no_wrap=name != "detail")
    for row in cells:
        table.add_row(*row)
    Console(soft_wrap=True).print(table)
