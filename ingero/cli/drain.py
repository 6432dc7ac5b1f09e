"""``ingero drain``: list the nodes ingero drained, and resume one (only if ingero drained it)."""

from __future__ import annotations

import json

import click

from ingero.runtime.errors import UsageError
from ingero.slurm.backend import DEFAULT_TIMEOUT
from ingero.slurm.factory import make_backend

BACKEND_OPTION = click.option(
    "--backend",
    type=click.Choice(["auto", "scontrol", "pyslurm"]),
    default="auto",
    show_default=True,
    help="How to talk to Slurm.",
)
TIMEOUT_OPTION = click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=DEFAULT_TIMEOUT,
    show_default=True,
    help="Seconds to wait for each Slurm command.",
)


@click.group()
def drain() -> None:
    """Slurm nodes drained by ingero (reason starting with 'ingero:')."""


@drain.command("list")
@BACKEND_OPTION
@TIMEOUT_OPTION
@click.option("--all", "show_all", is_flag=True, help="Also show nodes drained by others.")
@click.option(
    "--json", "as_json", is_flag=True, help="One JSON array of nodes (for scripts); [] if none."
)
def list_cmd(backend: str, timeout: float, show_all: bool, as_json: bool) -> None:
    """Nodes whose drain reason ingero wrote, with state and reason."""
    nodes = make_backend(backend, timeout).nodes()
    shown = [n for n in nodes if n.ingero_reason or (show_all and (n.drained or n.held_reason))]
    if as_json:
        rows = [
            {
                "node": n.name,
                "state": n.state,
                "flags": sorted(n.flags),
                "drained": n.drained,
                "owner": "ingero" if n.ingero_reason else "other",
                "reason": n.reason,
                "reason_user": n.reason_user,
                "reason_time": n.reason_time,
            }
            for n in shown
        ]
        click.echo(json.dumps(rows, indent=2))
        return
    if not shown:
        click.echo("no nodes drained by ingero")
        return
    width = max(len(n.name) for n in shown)
    for node in shown:
        state = "+".join([node.state.upper(), *sorted(node.flags)])
        owner = "ingero" if node.ingero_reason else "other"
        click.echo(f"{node.name:<{width}}  {state:<20}  {owner:<6}  {node.reason or ''}")


@drain.command("resume")
@click.argument("node")
@BACKEND_OPTION
@TIMEOUT_OPTION
def resume_cmd(node: str, backend: str, timeout: float) -> None:
    """Resume NODE, which must carry a reason ingero wrote."""
    slurm = make_backend(backend, timeout)
    found = {n.name: n for n in slurm.nodes()}.get(node)
    if found is None:
        raise UsageError(f"Slurm has no node named {node!r}")
    if not found.ingero_reason:
        reason = found.reason or "no reason"
        raise UsageError(
            f"refusing to resume {node}: its reason was not written by ingero ({reason}); "
            "use scontrol if you mean it"
        )
    slurm.resume(node)
    click.echo(f"resumed {node} (was: {found.reason})")
