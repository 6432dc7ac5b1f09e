"""``ingero gpu-sample``: write per-GPU rows to the node DB where ``ingero trace`` does not run.

``ingero trace`` writes the same ``gpu_intervals``/``gpu_processes`` rows itself every tracer
interval; this command is for nodes that run fleet-push without the tracer (no BPF, or not
wanted), so the score's compute and GPU-health signals are still measured. Do not run both
on one node: each would write a row per GPU per interval.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Protocol

import click

from ingero.nodedb.writer import Batch
from ingero.runtime.clock import Clock, SystemClock
from ingero.runtime.errors import UnavailableError
from ingero.runtime.hangup import ignore_hangups
from ingero.runtime.signals import stop_on_signals
from ingero.trace.gpusampler import GpuRows


class RowSource(Protocol):
    def sample(self, ts_start: float, ts_end: float) -> GpuRows: ...


class BatchSink(Protocol):
    def submit(self, batch: Batch) -> bool: ...


class Notifier(Protocol):
    def notify(self, state: str) -> None: ...


def run_loop(
    sampler: RowSource,
    sink: BatchSink,
    clock: Clock,
    interval: float,
    stop: threading.Event,
    notifier: Notifier | None = None,
    error: str | None = None,
) -> int:
    """Sample and write every ``interval`` until ``stop``; returns the batches written.
    A GPU problem (``error``: the one already reported) is logged when it changes and
    sampling goes on."""
    last = clock.now()
    written = 0
    while not stop.wait(interval):
        now = clock.now()
        rows = sampler.sample(last, now)
        last = now
        if rows.error != error:
            if rows.error is not None:
                print(f"ingero gpu-sample: {rows.error}", file=sys.stderr)
            error = rows.error
        if rows.intervals and sink.submit(
            Batch(gpu_intervals=rows.intervals, gpu_processes=rows.processes)
        ):
            written += 1
        if notifier is not None:
            status = error or f"{len(rows.intervals)} GPU rows, {len(rows.processes)} processes"
            notifier.notify(f"WATCHDOG=1\nSTATUS={status}")
    return written


@click.command("gpu-sample")
@click.option("--db", "db_path", type=click.Path(path_type=Path),
              default=Path("/var/lib/ingero/ingero.db"), show_default=True,
              help="Node DB to write.")  # fmt: skip
@click.option("--interval", type=click.FloatRange(min=0.2), default=1.0, show_default=True,
              help="Seconds between GPU rows.")  # fmt: skip
@click.option("--max-db", default=None, help="Prune oldest rows beyond this size (e.g. 1G).")
def gpu_sample(db_path: Path, interval: float, max_db: str | None) -> int:
    """Write a gpu_intervals row per GPU every interval (NVML, else nvidia-smi), for nodes
    where `ingero trace` does not run. Exits 69 on a host that has neither."""
    ignore_hangups("gpu-sample", "nothing to reload")
    import sdnotify

    from ingero.cli.trace import parse_size
    from ingero.nodedb.writer import NodeDbWriter
    from ingero.trace.gpusampler import default_sampler

    max_bytes = parse_size(max_db) if max_db else None
    clock = SystemClock()
    sampler = default_sampler(clock)
    first = sampler.sample(clock.now() - interval, clock.now())
    if not first.intervals and sampler.smi is None and sampler.nvml and sampler.nvml.gave_up:
        # A driver that is not loaded yet may still come; a missing library never will.
        sampler.close()
        raise UnavailableError(f"{first.error}, and nvidia-smi is not installed")
    try:
        db_path.parent.mkdir(parents=True, exist_ok=True)
        writer = NodeDbWriter(db_path, max_bytes)
    except Exception as exc:
        sampler.close()
        raise UnavailableError(f"{db_path}: cannot open the node DB: {exc}") from exc
    stop, _ = stop_on_signals()
    notifier = sdnotify.SystemdNotifier()
    writer.start()
    if first.intervals:
        writer.submit(Batch(gpu_intervals=first.intervals, gpu_processes=first.processes))
    elif first.error:
        print(f"ingero gpu-sample: {first.error}", file=sys.stderr)
    notifier.notify(f"READY=1\nSTATUS={first.error or 'sampling GPUs'}")
    try:
        run_loop(sampler, writer, clock, interval, stop, notifier, first.error)
    finally:
        writer.close()
        sampler.close()
        notifier.notify("STOPPING=1")
    return 0
