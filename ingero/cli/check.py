"""``ingero check``: report whether this node can run ``ingero trace``, with fix hints; with
``--health``, whether ingero knows this node to be bad (NHC's ``check_ingero`` calls it)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from ingero import nodedb
from ingero.runtime.errors import EXIT_FAILURE, EXIT_OK, EXIT_UNAVAILABLE
from ingero.schema.healthstate import STATE_PATH

_MARK = {"ok": "[green]✓[/]", "warn": "[yellow]![/]", "fail": "[red]✗[/]", "info": "[blue]·[/]"}


def _duration(ctx: click.Context, param: click.Parameter, value: str) -> float:
    from ingero.runtime.config import parse_duration

    try:
        return float(parse_duration(value))
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _xids(ctx: click.Context, param: click.Parameter, value: str | None) -> frozenset[int] | None:
    if value is None:
        return None
    try:
        return frozenset(int(x) for x in value.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(
            f"expected XID numbers separated by commas, got {value!r}"
        ) from None


@click.command("check")
@click.option("--db", "db_path", type=click.Path(path_type=Path), envvar="INGERO_DB",
              default=Path(nodedb.DEFAULT_PATH), show_default=True,
              help="Node DB: must be writable; with --health, where GPU rows are read "
              "[env INGERO_DB].")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--health", is_flag=True,
              help="Check the node's health instead: exit 1 with one line when ingero knows it "
              "is bad (a straggler episode past --episode-age, a GPU fault), else 0.")  # fmt: skip
@click.option("--state-file", type=click.Path(path_type=Path), default=Path(STATE_PATH),
              show_default=True, help="fleet-push's health state file (--health).")  # fmt: skip
@click.option("--episode-age", default="10m", show_default=True, callback=_duration,
              help="An open straggler episode this old fails the node (--health).")  # fmt: skip
@click.option("--no-stragglers", is_flag=True,
              help="Leave straggler episodes to Fleet's drain controller: check GPU health "
              "only (--health).")  # fmt: skip
@click.option("--gpu-window", default="15m", show_default=True, callback=_duration,
              help="GPU rows this recent are read; an XID this recent fails (--health).")  # fmt: skip
@click.option("--xid-ignore", callback=_xids, metavar="N,N,...",
              help="XIDs that do not fail the node (default: 13,31,43,45, the application's "
              "own) (--health).")  # fmt: skip
@click.option("--gpus", "expect_gpus", type=click.IntRange(min=1),
              help="GPUs the node has: fewer reporting fails it (--health).")  # fmt: skip
def check(
    db_path: Path,
    as_json: bool,
    health: bool,
    state_file: Path,
    episode_age: float,
    no_stragglers: bool,
    gpu_window: float,
    xid_ignore: frozenset[int] | None,
    expect_gpus: int | None,
) -> int:
    """Check kernel, BPF permissions, tracefs, BCC, headers, CUDA/NCCL, GPU, Slurm, node DB.

    Exit code 0 when tracing can run, 69 when something it needs is missing. With --health:
    0 when the node is healthy (or nothing tells), 1 when it is not, with one line.
    """
    if health:
        return _health(
            db_path, state_file, as_json, episode_age, not no_stragglers, gpu_window,
            xid_ignore, expect_gpus,
        )  # fmt: skip
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


def _health(
    db_path: Path,
    state_file: Path,
    as_json: bool,
    episode_age: float,
    stragglers: bool,
    gpu_window: float,
    xid_ignore: frozenset[int] | None,
    expect_gpus: int | None,
) -> int:
    from ingero.check.health import APPLICATION_XIDS, HealthConfig, Sources, check_health

    config = HealthConfig(
        episode_age=episode_age,
        stragglers=stragglers,
        gpu_window=gpu_window,
        xid_ignore=APPLICATION_XIDS if xid_ignore is None else xid_ignore,
        expect_gpus=expect_gpus,
    )
    verdict = check_health(Sources(db_path, state_file), time.time(), config)
    click.echo(json.dumps(verdict.to_json()) if as_json else verdict.line())
    return EXIT_OK if verdict.healthy else EXIT_FAILURE
