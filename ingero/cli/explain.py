"""``ingero explain``: why this node may be slow, from its node DB (read-only)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import click

from ingero.cli.options import (
    explicit,
    fanout_from,
    fanout_options,
    node_db_option,
    seconds,
)
from ingero.fanout.ssh import Fanout
from ingero.runtime.errors import EXIT_OK, UsageError


@click.command("explain")
@node_db_option
@click.option(
    "--window",
    "window",
    default="5m",
    show_default=True,
    help="Recent window, compared with the same length just before it (30s, 5m, 1h).",
)
@click.option("--job", "job_id", default=None, help="Only the calls of this Slurm job.")
@click.option(
    "--until",
    "until",
    default=None,
    help="End of the recent window: Unix seconds or 'latest' (newest row); default now.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@fanout_options
@click.pass_context
def explain(ctx: click.Context, db_path: Path, window: str, job_id: str | None,
            until: str | None, as_json: bool, nodes: str | None, job_nodes: str | None,
            fanout: int, node_timeout: str, ssh_options: str | None,
            remote_ingero: str) -> int:  # fmt: skip
    """Explain why this node may be slow: the last window against the one before it.

    Causal chains first (host, GPU and CUDA/NCCL changes linked to the throughput drop by
    time and process, each with a confidence and a fix hint), then what changed:
    kernel-launch rate, CUDA call latency and time share per op, sync/memcpy waits, NCCL
    collectives, errors, GPU busy and memory, off-CPU time, page allocations, block I/O,
    TCP retransmits, dropped samples. With --nodes or --job-nodes each node explains
    itself over SSH and the nodes' NCCL calls are aligned to find a lagging peer; --job
    still filters the calls (and defaults to --job-nodes' job). Exit 0 (also for an empty
    window), 69 when the node DB is missing, 65 when the file is not a node DB.
    """
    spread = fanout_from(nodes, job_nodes, fanout, node_timeout, ssh_options, remote_ingero)
    if spread is not None:
        args = ["explain", "--json", "--window", window]
        job = job_id if job_id is not None else job_nodes
        args += [*(["--job", job] if job else []), *(["--until", until] if until else [])]
        if explicit(ctx, "db_path"):
            args += ["--db", str(db_path)]
        return _across(spread, args, as_json)
    from ingero.explain.node import explain_node
    from ingero.explain.render import as_json as report_json
    from ingero.explain.render import print_text

    window_s = seconds("--window", window, positive=True)
    explained = explain_node(db_path, window_s, _until(until), job_id)
    if as_json:
        click.echo(json.dumps(report_json(explained), indent=2))
    else:
        print_text(explained)
    return EXIT_OK


def _until(text: str | None) -> float | Literal["latest"] | None:
    if text is None:
        return None
    if text == "latest":
        return "latest"
    try:
        return float(text)
    except ValueError:
        raise UsageError(f"--until: expected Unix seconds or 'latest', got {text!r}") from None


def _across(spread: Fanout, args: list[str], as_json: bool) -> int:
    from ingero.fanout.across import explain_nodes
    from ingero.fanout.ssh import no_node_answered

    across = explain_nodes(spread, args)
    for failure in across.failed:
        click.echo(f"ingero: {failure['node']}: {failure['error']}", err=True)
    if as_json:
        click.echo(json.dumps(across.as_json(), indent=2))
    else:
        for line in across.lines():
            click.echo(line)
    if not across.reports:
        raise no_node_answered(across.failed)
    return EXIT_OK
