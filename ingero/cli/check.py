"""``ingero check``: report whether this node can run ``ingero trace``, with fix hints."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ingero import nodedb
from ingero.runtime.errors import EXIT_OK, EXIT_UNAVAILABLE

_MARK = {"ok": "[green]✓[/]", "warn": "[yellow]![/]", "fail": "[red]✗[/]", "info": "[blue]·[/]"}


@click.command("check")
@click.option("--db", "db_path", type=click.Path(path_type=Path),
              default=Path(nodedb.DEFAULT_PATH), show_default=True,
              help="Node DB that must be writable.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def check(db_path: Path, as_json: bool) -> int:
    """Check kernel, BPF permissions, tracefs, BCC, headers, CUDA/NCCL, GPU, Slurm, node DB.

    Exit code 0 when tracing can run, 69 when something it needs is missing.
    """
    from rich.console import Console

    from ingero.check.checks import Host, run_all

    results = run_all(Host(), db_path)
    can_trace = not any(r.blocks_tracing for r in results)
    if as_json:
        click.echo(
            json.dumps({"can_trace": can_trace, "checks": [r.__dict__ for r in results]}, indent=2)
        )
    else:
        console = Console(highlight=False)
        for r in results:
            console.print(f"{_MARK[r.status]} {r.name}: {r.detail}", markup=True)
            if r.fix and r.status != "ok":
                console.print(f"    fix: {r.fix}", markup=False)
        console.print("tracing can run" if can_trace else "tracing cannot run", markup=False)
    return EXIT_OK if can_trace else EXIT_UNAVAILABLE
