"""``ingero demo``: straggler detection end to end on this machine (no root, no GPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ingero.runtime.errors import EXIT_FAILURE, UsageError
from ingero.runtime.signals import StopSignals
from ingero.workload.generator import DEFAULT_SHAPE, SHAPE_NAMES
from ingero.workload.lockstep import LOCKSTEP_CAUSES


@click.command("demo")
@click.option("--nodes", type=int, default=8, show_default=True, help="Simulated GPU nodes.")
@click.option(
    "--push-interval",
    type=float,
    default=1.0,
    show_default=True,
    help="Seconds between pushes (Fleet's tick too).",
)
@click.option(
    "--tracer-interval",
    type=float,
    default=None,
    help="Seconds between the workloads' node DB writes, as `ingero trace --interval`"
    " (default: a quarter of the push interval, at least 0.05).",
)
@click.option(
    "--straggler", default=None, help="Node to slow down, e.g. node-03 (default: random)."
)
@click.option(
    "--slowdown",
    type=float,
    default=0.3,
    show_default=True,
    help="How much slower the straggler runs (0.3 = 30%).",
)
@click.option(
    "--shape",
    type=click.Choice(SHAPE_NAMES),
    default=DEFAULT_SHAPE,
    show_default=True,
    help="The workloads' reference training loop (see ingero workload --shape).",
)
@click.option(
    "--cause",
    type=click.Choice(LOCKSTEP_CAUSES),
    default=None,
    help="What slows the straggler down, written as a real node records it; at the end"
    " `ingero explain` on that node must name it as its top causal chain ('gpu', a GPU"
    " slower with NVML silent, only in a lock-step job, and explained by nothing).",
)
@click.option(
    "--independent",
    is_flag=True,
    help="Each node its own process (as inference replicas), not the ranks of one lock-step"
    " training job (the default; --shape inference is always independent).",
)
@click.option(
    "--stall",
    "stall",
    default=None,
    metavar="NODE",
    help="Stall this node's rank (it stops working, its job goes on) instead of slowing one.",
)
@click.option(
    "--warmup",
    type=float,
    default=15.0,
    show_default=True,
    help="Seconds before the slowdown is injected (longer if Fleet has no quorum yet).",
)
@click.option(
    "--duration",
    type=float,
    default=40.0,
    show_default=True,
    help="Seconds after injection to wait for detection.",
)
@click.option("--no-live", is_flag=True, help="Plain line output (for CI and pipes).")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep node DBs, state and logs here (default: a temporary directory).",
)
@click.option("--seed", type=int, default=None, help="Seed for the straggler choice and noise.")
@click.option(
    "--hold",
    is_flag=True,
    help="After the summary keep Fleet, the sink and the agents running until Ctrl-C.",
)
def demo(
    nodes: int,
    push_interval: float,
    tracer_interval: float | None,
    straggler: str | None,
    slowdown: float,
    shape: str,
    independent: bool,
    stall: str | None,
    cause: str | None,
    warmup: float,
    duration: float,
    no_live: bool,
    workdir: Path | None,
    seed: int | None,
    hold: bool,
) -> int:
    """Run a real Fleet and NODES real fleet-push agents on a synthetic lock-step training
    job (one rank a node; --independent: a workload a node), slow one node down (or hang
    its rank) and show the moment it is detected, and that its waiting peers are not. Exits 0 when it was (and, with --cause,
    when `ingero explain` on it names that cause first)."""
    from ingero.demo.runner import Demo, DemoOptions, DemoResult
    from ingero.demo.view import LiveView, PlainView, summary

    options = DemoOptions(
        nodes=nodes,
        push_interval=push_interval,
        tracer_interval=tracer_interval,
        straggler=straggler,
        slowdown=slowdown,
        shape=shape,
        stall=stall,
        cause=cause,
        independent=independent,
        warmup=warmup,
        duration=duration,
        workdir=workdir,
        seed=seed,
        hold=hold,
    )
    live = not no_live and sys.stdout.isatty()
    view: LiveView | PlainView = LiveView() if live else PlainView(sys.stdout)

    def report(result: DemoResult) -> None:
        view.close()
        click.echo(summary(runner.state, result))
        if not result.ok:
            click.echo(f"ingero demo: {result.reason}", err=True)
        elif hold:
            click.echo("holding: everything keeps running; Ctrl-C to stop", err=True)

    try:
        runner = Demo(options, view, on_result=report)
    except ValueError as exc:
        raise UsageError(str(exc)) from None

    StopSignals(runner.stop).install()
    try:
        result = runner.run()
    finally:
        view.close()
    return 0 if result.ok else EXIT_FAILURE
