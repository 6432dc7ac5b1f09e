"""``ingero workload``: a synthetic training process that writes the node DB (no GPU needed)."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from ingero.errors import UsageError


@click.command("workload")
@click.option(
    "--db",
    "db_path",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Node DB to write (created with the current schema).",
)
@click.option(
    "--interval",
    type=float,
    default=0.5,
    show_default=True,
    help="Seconds between writes (one interval row set each).",
)
@click.option(
    "--launch-rate",
    type=float,
    default=2000.0,
    show_default=True,
    help="Kernel launches per second at full speed.",
)
@click.option("--gpus", type=int, default=2, show_default=True)
@click.option(
    "--gpu-busy",
    type=float,
    default=0.85,
    show_default=True,
    help="Busy fraction of each GPU at full speed.",
)
@click.option(
    "--noise",
    type=float,
    default=0.03,
    show_default=True,
    help="Relative standard deviation of every rate.",
)
@click.option(
    "--slowdown",
    type=float,
    default=0.3,
    show_default=True,
    help="Slowdown SIGUSR1 toggles (0.3 = 30%% less work per second).",
)
@click.option(
    "--control",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="File holding the current slowdown (e.g. 0.3), re-read every interval.",
)
@click.option(
    "--proc-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Also keep a synthetic /proc (stat, meminfo) of the simulated host here.",
)
@click.option("--job-id", default=None, help="Slurm job id to tag rows with.")
@click.option("--rank", type=int, default=None)
@click.option("--seed", type=int, default=None, help="Random seed (reproducible noise).")
@click.option("--duration", type=float, default=None, help="Stop after this many seconds.")
def workload(
    db_path: Path,
    interval: float,
    launch_rate: float,
    gpus: int,
    gpu_busy: float,
    noise: float,
    slowdown: float,
    control: Path | None,
    proc_dir: Path | None,
    job_id: str | None,
    rank: int | None,
    seed: int | None,
    duration: float | None,
) -> None:
    """Write synthetic cudaLaunchKernel, GPU-busy and host intervals to a node DB.

    Stops on SIGTERM or Ctrl-C; SIGUSR1 toggles the slowdown.
    """
    from ingero.workload.generator import WorkloadProfile
    from ingero.workload.runner import WorkloadRunner

    logging.basicConfig(level=logging.INFO, format="ingero workload: %(message)s")
    profile = WorkloadProfile(
        launch_rate=launch_rate,
        gpus=gpus,
        gpu_busy=gpu_busy,
        noise=noise,
        job_id=job_id,
        rank=rank,
    )
    try:
        if not 0 <= slowdown < 1:
            raise ValueError("--slowdown must be in [0, 1)")
        runner = WorkloadRunner(
            db_path,
            profile,
            interval_s=interval,
            slowdown=slowdown,
            control=control,
            seed=seed,
            proc_dir=proc_dir,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    runner.install_signals()
    runner.run(duration)
