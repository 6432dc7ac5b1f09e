"""``ingero workload``: a synthetic training process that writes the node DB (no GPU needed),
shaped like what ``ingero trace`` and its NVML sampler record of a real one on an H100."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import click

from ingero.runtime.errors import UsageError
from ingero.workload.generator import CAUSES, DEFAULT_SHAPE, SHAPE_NAMES
from ingero.workload.lockstep import LOCKSTEP_CAUSES


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
    "--shape",
    type=click.Choice(SHAPE_NAMES),
    default=DEFAULT_SHAPE,
    show_default=True,
    help="Which reference training loop to imitate (docs/demo.md lists their rates).",
)
@click.option(
    "--launch-rate",
    type=float,
    default=None,
    help="cuLaunchKernel calls per second at full speed (default: the shape's).",
)
@click.option("--gpus", type=int, default=1, show_default=True)
@click.option(
    "--servers",
    type=int,
    default=1,
    show_default=True,
    help="Inference servers of --shape inference (a slowdown slows the first one only).",
)
@click.option(
    "--gpu-busy",
    type=float,
    default=None,
    help="NVML utilization of each GPU at full speed, 0-1 (default: the shape's).",
)
@click.option(
    "--gpu-mem-used",
    type=float,
    default=None,
    help="GPU memory used on each GPU, GiB (default: the shape's; a big training job or an "
    "inference engine holds nearly all of it).",
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
    help="Slowdown SIGUSR1 toggles (0.3 = 30% less work per second).",
)
@click.option(
    "--cause",
    type=click.Choice(LOCKSTEP_CAUSES),
    default=None,
    help="What the slowdown comes from, written as a real node records it (default: the"
    " process sleeps). A control file can name its own: '0.3 io'. 'gpu' (a GPU slower with"
    " NVML silent) is for a lock-step job's rank.",
)
@click.option(
    "--slow-after",
    type=float,
    default=None,
    help="Turn the slowdown (and its --cause) on after this many seconds, as SIGUSR1 would.",
)
@click.option(
    "--control",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="File holding the current slowdown (0.3), with its cause ('0.3 cpu') or 'stall',"
    " re-read every interval; 'for N' after it: the next N intervals only ('0.3 for 2').",
)
@click.option(
    "--stall-after",
    type=float,
    default=None,
    help="Stop working after this many seconds (a hung rank; the process and job go on).",
)
@click.option(
    "--jobs-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep the job's file here while running, as the Slurm prolog/epilog do (needs --job-id).",
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
@click.option(
    "--job-ranks",
    type=int,
    default=None,
    help="A lock-step training job of this many ranks, one simulated node each, in this one"
    " process: --db (and --proc-dir, --jobs-dir) then hold {rank} or {node}; the control"
    " file takes 'rank R S [cause]', 'rank R hang [lost]', 'stuck', 'phase S' (docs/demo.md).",
)
@click.option(
    "--slow-rank",
    type=int,
    default=0,
    show_default=True,
    help="With --job-ranks: the rank --slow-after slows and --hang-after hangs.",
)
@click.option(
    "--hang-after",
    type=float,
    default=None,
    help="With --job-ranks: --slow-rank stops before its next collective after this many"
    " seconds (its peers wait in it).",
)
@click.option(
    "--step",
    type=float,
    default=None,
    help="With --job-ranks: a healthy rank's step in seconds (default 1).",
)
@click.option(
    "--late",
    type=float,
    default=0.0,
    show_default=True,
    help="Write each interval's rows up to this many seconds after it ends (a tracer a loaded "
    "node delays).",
)
def workload(
    db_path: Path,
    interval: float,
    shape: str,
    launch_rate: float | None,
    gpus: int,
    servers: int,
    gpu_busy: float | None,
    gpu_mem_used: float | None,
    noise: float,
    slowdown: float,
    cause: str | None,
    slow_after: float | None,
    control: Path | None,
    stall_after: float | None,
    jobs_dir: Path | None,
    proc_dir: Path | None,
    job_id: str | None,
    rank: int | None,
    seed: int | None,
    duration: float | None,
    job_ranks: int | None,
    slow_rank: int,
    hang_after: float | None,
    step: float | None,
    late: float,
) -> None:
    """Write what `ingero trace` records of a training process on a real GPU node: driver
    kernel launches (CUDA graph replays with --shape graphs), rare syncs, off-CPU time,
    NVML GPU rows; with --shape inference, inference servers' decode streams (stream syncs,
    decode and prefill steps).

    Stops on SIGTERM or Ctrl-C; SIGUSR1 toggles the slowdown. With --cause the slowdown shows
    what that cause shows on a real node (off-CPU time, block I/O, cuMemAlloc calls, NVML
    thermal slowdown, TCP retransmits, graphs captured again), so `ingero explain` can
    name it.
    """
    from ingero.workload.generator import WorkloadProfile
    from ingero.workload.runner import WorkloadRunner

    logging.basicConfig(level=logging.INFO, format="ingero workload: %(message)s")
    if job_ranks is not None:
        _job(
            db_path, job_ranks, shape, interval, noise, slowdown, cause, slow_after, control,
            stall_after, hang_after, slow_rank, step, jobs_dir, proc_dir, job_id, seed, duration,
            gpus, gpu_mem_used, late,
        )  # fmt: skip
        return
    if cause is not None and cause not in CAUSES:
        raise UsageError(f"--cause {cause} is for a lock-step job's rank (--job-ranks)")
    profile = WorkloadProfile(
        # Its own pid, as the tracer would record it: whoever reads the node DB can see
        # whether the "training process" is still alive.
        pid=os.getpid(),
        shape=shape,
        launch_rate=launch_rate,
        gpus=gpus,
        servers=servers,
        gpu_busy=gpu_busy,
        gpu_mem_used=gpu_mem_used,
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
            stall_after=stall_after,
            jobs_dir=jobs_dir,
            cause=cause,
            slow_after=slow_after,
            late=late,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    runner.install_signals()
    runner.run(duration)


def _job(
    db_path: Path,
    ranks: int,
    shape: str,
    interval: float,
    noise: float,
    slowdown: float,
    cause: str | None,
    slow_after: float | None,
    control: Path | None,
    stall_after: float | None,
    hang_after: float | None,
    slow_rank: int,
    step: float | None,
    jobs_dir: Path | None,
    proc_dir: Path | None,
    job_id: str | None,
    seed: int | None,
    duration: float | None,
    gpus: int,
    gpu_mem_used: float | None,
    late: float,
) -> None:
    """A lock-step job of ``ranks`` ranks (ingero.workload.jobrunner)."""
    from ingero.workload.jobrunner import JobRunner
    from ingero.workload.lockstep import STEP_S, JobProfile

    if late:
        raise UsageError("--late is for a process on its own, not --job-ranks")
    try:
        profile = JobProfile(
            ranks=ranks,
            shape=shape,
            step_s=STEP_S if step is None else step,
            noise=noise,
            job_id=job_id,
            gpus=gpus,
            gpu_mem_used=gpu_mem_used,
        )
        profile.validate()
        runner = JobRunner(
            db_path,
            profile,
            interval_s=interval,
            control=control,
            seed=seed,
            proc_template=proc_dir,
            jobs_template=jobs_dir,
            slowdown=slowdown,
            cause=cause,
            slow_rank=slow_rank,
            slow_after=slow_after,
            hang_after=hang_after if hang_after is not None else stall_after,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    runner.install_signals()
    runner.run(duration)
