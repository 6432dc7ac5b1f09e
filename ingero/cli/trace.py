"""``ingero trace``: run the eBPF tracer, with a live view or headless (``--record``)."""

from __future__ import annotations

import re
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ingero import nodedb
from ingero.runtime.clock import SystemClock
from ingero.runtime.errors import UnavailableError, UsageError
from ingero.runtime.hangup import ignore_hangups
from ingero.runtime.signals import stop_on_signals
from ingero.trace.collectives import DEFAULT_SAMPLE_MAX

if TYPE_CHECKING:
    from ingero.trace.tracer import TickResult, Tracer

DEFAULT_DB = Path(nodedb.DEFAULT_PATH)
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``512M``, ``2G``, ``100k`` or bytes → bytes (powers of 1024)."""
    m = _SIZE_RE.match(text)
    if m is None:
        raise UsageError(f"--max-db: expected a size like 512M or 2G, got {text!r}")
    power = " kmgt".index(m.group(2).lower() or " ")
    size = int(float(m.group(1)) * 1024**power)
    if size < 64 * 1024:
        raise UsageError(f"--max-db: {text} is too small (at least 64k)")
    return size


@click.command("trace")
@click.option("--pid", type=int, default=None, help="Trace only this process.")
@click.option("--record", is_flag=True, help="Headless: no live view; sd_notify READY/WATCHDOG.")
@click.option("--db", "db_path", type=click.Path(path_type=Path), default=DEFAULT_DB,
              show_default=True, help="Node DB to write.")  # fmt: skip
@click.option("--max-db", default=None, help="Prune oldest rows beyond this size (e.g. 1G).")
@click.option("--interval", type=click.FloatRange(min=0.05), default=1.0, show_default=True,
              help="Seconds per aggregate interval.")  # fmt: skip
@click.option("--sample-every", type=click.IntRange(min=1), default=64, show_default=True,
              help="Send 1 in N CUDA calls to the ring buffer as raw events (NCCL: all).")  # fmt: skip
@click.option("--nccl-sample-max", type=click.IntRange(min=1), default=DEFAULT_SAMPLE_MAX,
              show_default=True,
              help="Per communicator and interval, NCCL collectives written to nccl_calls "
                   "individually; beyond it a power-of-two stride of sequence numbers.")  # fmt: skip
@click.option("--gpu/--no-gpu", default=True, show_default=True,
              help="Write a gpu_intervals row per GPU every interval (NVML, else nvidia-smi).")  # fmt: skip
@click.option(
    "--stacks/--no-stacks",
    default=True,
    show_default=True,
    help="Sampled and slow calls carry their caller's native and Python stack.",
)
@click.option("--stack-slow-ms", type=click.FloatRange(min=0), default=None,
              help="A call at least this long is sampled with its stack [default: "
                   "ingero.trace.probes.DEFAULT_STACK_SLOW_MS, 10].")  # fmt: skip
@click.option("--launch-returns", type=click.Choice(["auto", "sampled", "all"]), default="auto",
              show_default=True,
              help="Kernel and graph launches: counted at entry with a sample timed (sampled: "
                   "uprobe sessions, 6.13+; auto picks it where it can run), or every launch "
                   "timed by a return probe (all).")  # fmt: skip
@click.option("--launch-timed-per-s", type=click.IntRange(min=1), default=None,
              help="Sampled launches: about this many a second are timed per process, op "
                   "and stream [default: ingero.trace.probes.DEFAULT_LAUNCH_TIMED_PER_S, "
                   "1024].")  # fmt: skip
def trace(
    pid: int | None,
    record: bool,
    db_path: Path,
    max_db: str | None,
    interval: float,
    sample_every: int,
    nccl_sample_max: int,
    gpu: bool,
    stacks: bool,
    stack_slow_ms: float | None,
    launch_returns: str,
    launch_timed_per_s: int | None,
) -> int:
    """Trace CUDA, NCCL and host events into the node DB (needs root or CAP_BPF+CAP_PERFMON)."""
    ignore_hangups("trace", "nothing to reload; restart to change probes or options")
    from ingero.nodedb.writer import NodeDbWriter
    from ingero.trace.bccload import BccUnavailable
    from ingero.trace.collectives import Collectives
    from ingero.trace.gpusampler import default_sampler
    from ingero.trace.probes import (
        DEFAULT_LAUNCH_TIMED_PER_S,
        DEFAULT_STACK_SLOW_MS,
        ProbeError,
        load,
    )
    from ingero.trace.stacks import StackResolver
    from ingero.trace.tags import TagCache
    from ingero.trace.tracer import Tracer, system_libraries

    max_bytes = parse_size(max_db) if max_db else None
    if pid is not None and not Path(f"/proc/{pid}").exists():
        raise UsageError(f"--pid {pid}: no such process")
    # Before the program's compile, which takes seconds (15 s on a real node): a stop asked
    # for meanwhile is answered when it returns, with exit 0, not by SIGTERM's default death.
    stop, _ = stop_on_signals()
    try:
        db_path.parent.mkdir(parents=True, exist_ok=True)
        writer = NodeDbWriter(db_path, max_bytes)
    except Exception as exc:
        raise UnavailableError(f"{db_path}: cannot open the node DB: {exc}") from exc
    try:
        slow = DEFAULT_STACK_SLOW_MS if stack_slow_ms is None else stack_slow_ms
        timed = DEFAULT_LAUNCH_TIMED_PER_S if launch_timed_per_s is None else launch_timed_per_s
        probes = load(sample_every, -1 if pid is None else pid, stacks=stacks, stack_slow_ms=slow,
                      launch_returns=launch_returns, launch_timed_per_s=timed)  # fmt: skip
    except (BccUnavailable, ProbeError) as exc:
        writer.close()
        raise UnavailableError(f"{exc} (run 'ingero check')") from exc
    if stop.is_set():
        probes.close()
        writer.close()
        return 0
    print(f"ingero trace: launches: {probes.launch_mode} ({probes.launch_why})", file=sys.stderr)
    find = type(probes.bpf).find_library

    def find_lib(name: str) -> str | None:
        found = find(name)
        return found.decode() if isinstance(found, bytes) else found

    gpus = default_sampler() if gpu else None
    tracer = Tracer(probes, writer, SystemClock(), TagCache(), pid=pid,
                    extra_libraries=system_libraries(find_lib) if pid is None else [],
                    gpu=gpus, nccl=Collectives(nccl_sample_max),
                    stacks=StackResolver(probes) if stacks else None)  # fmt: skip
    writer.start()
    try:
        tracer.start()
        if record:
            _run_headless(tracer, interval, stop)
        else:
            _run_live(tracer, interval, stop)
    finally:
        try:
            tracer.tick(final=True)
        finally:
            writer.close()
            probes.close()
            if gpus is not None:
                gpus.close()
    return 0


PUMP_S = 0.05
RESCAN_S = 5.0


def _wait(tracer: Tracer, interval: float, stop: threading.Event) -> bool:
    """Sleep one interval, reading samples every PUMP_S; False once asked to stop."""
    deadline = time.monotonic() + interval
    while (left := deadline - time.monotonic()) > 0:
        if stop.wait(min(PUMP_S, left)):
            return False
        try:
            # Bounded by the interval's end: the tick and the stop request come on time
            # however many samples wait.
            tracer.pump(max(0.0, deadline - time.monotonic()))
        except Exception as exc:  # the next pump or tick retries; tracing goes on
            print(f"ingero trace: reading samples failed: {exc}", file=sys.stderr)
    return not stop.is_set()


def step(tracer: Tracer, n: int, interval: float) -> TickResult | None:
    """Interval ``n``: tick (and rescan every RESCAN_S); None when it failed (logged)."""
    try:
        result = tracer.tick()
        if n % max(1, round(RESCAN_S / interval)) == 0:
            tracer.rescan()
    except Exception as exc:  # a transient map or /proc error must not end the service
        print(f"ingero trace: interval failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None
    return result


def _run_headless(tracer: Tracer, interval: float, stop: threading.Event) -> None:
    from ingero.runtime.systemd import notifier as systemd_notifier

    notifier = systemd_notifier()
    notifier.notify(f"READY=1\nSTATUS=tracing, {tracer.probe_count} probes attached")
    n = 0
    while _wait(tracer, interval, stop):
        n += 1
        result = step(tracer, n, interval)
        if result is None:
            # No watchdog ping: if intervals keep failing, systemd restarts the service.
            notifier.notify("STATUS=the last interval failed (see the journal)")
            continue
        calls = sum(r["count"] for r in result.intervals if isinstance(r["count"], int))
        notifier.notify(
            f"WATCHDOG=1\nSTATUS={calls} calls, {result.processes} processes, "
            f"{result.samples} samples, {result.host['dropped_events']} dropped, "
            f"{result.gpus} GPU rows in the last interval"
        )
    notifier.notify("STOPPING=1")


def _run_live(tracer: Tracer, interval: float, stop: threading.Event) -> None:
    from rich.live import Live

    from ingero.trace.live import render

    n = 0
    with Live(auto_refresh=False) as live:
        while _wait(tracer, interval, stop):
            n += 1
            result = step(tracer, n, interval)
            if result is not None:
                live.update(render(result), refresh=True)
