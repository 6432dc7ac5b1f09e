"""Overhead of ``ingero trace`` on a CUDA-calling workload, beside the uprobe floors.

For a target rate (10,000, 50,000 and 200,000 calls/s per process) the workload spins CPU
work between cudaLaunchKernel calls, calibrated so that one untraced iteration lasts
1/rate seconds. The configurations run interleaved, round after round, each as a fresh
process (uprobes attach by library path, so every new process is caught):

- ``none``: no probes;
- ``entry``: an empty entry uprobe alone on the same function: the floor of any design
  that counts calls (the least a launch counted at entry can cost);
- ``floor``: an empty entry + return uprobe pair on the same function: the cost of any
  uprobe design that times every call;
- ``before``: ingero's full BPF program (every CUDA probe, host tracepoints, ring buffer)
  with every launch timed (``--launch-returns all``: the program before launches were
  counted at entry, and the tracer's way on a kernel without uprobe sessions), call stacks
  on sampled and slow calls (the default), attached through uprobe_multi links as the
  tracer does where the kernel has them;
- ``ingero``: the same program as the tracer runs it by default: launches counted at entry
  through uprobe session links (6.13+), about 1,024 a second timed at their return;
- with ``--more``: ``perf-uprobes`` (``ingero`` attached as BCC's perf-event uprobes, the
  tracer's way on a kernel before 6.6: every launch timed), ``no-stacks`` (``ingero``
  with ``--no-stacks``), ``no-samples`` (``ingero`` with no call sampled to the ring
  buffer, ``--sample-every`` 2^40: the per-call bookkeeping alone) and ``no-reads``
  (``ingero`` without its reads of user memory at a launch's entry, the stream and the
  return address: what they cost; launches then name no stream).

Times are the workload thread's CPU time (uprobe handlers run in its context; waiting for
a CPU on a shared machine does not count). First, back-to-back calls (no work between)
give the ns each configuration adds per call, beside the pair (``floor``) and the entry
uprobe. Then, per rate: median ns per iteration of each configuration and its slowdown in
percent (throughput with and without tracing). Needs root, BCC and the CUDA toolkit (gcc
against its libcudart). Usage: ``python bench/trace_overhead.py [--rounds 7]``.

``--call`` picks the workload's call: ``launch`` (cudaLaunchKernel, the stream in an
argument slot), ``launch-ex`` (cudaLaunchKernelExC, the stream read from its config in user
memory) or ``event`` (cudaEventRecord then cudaEventSynchronize of that event: the event's
stream kept at the record and looked up at the sync; figures are per pair of calls, and
the floors probe both functions).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ingero.trace.facilities import LAUNCH_ALL, LAUNCH_AUTO
from ingero.trace.ops import CUDART
from ingero.trace.probes import DEFAULT_SAMPLE_EVERY, load, probe_names
from ingero.trace.procmaps import LibraryFile
from ingero.trace.uprobemulti import close_all

CUDA_HOME = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
# The functions each --call makes, one iteration each (the floor probes the same ones).
CALLS = {
    "launch": (b"cudaLaunchKernel",),
    "launch-ex": (b"cudaLaunchKernelExC",),
    "event": (b"cudaEventRecord", b"cudaEventSynchronize"),
}
FLOOR_PROGRAM = "int enter(void *ctx) { return 0; }\nint leave(void *ctx) { return 0; }\n"
TRACEPOINTS = {
    "sched:sched_switch": "tracepoint__sched__sched_switch",
    "sched:sched_process_exit": "tracepoint__sched__sched_process_exit",
    "kmem:mm_page_alloc": "tracepoint__kmem__mm_page_alloc",
    "block:block_rq_issue": "tracepoint__block__block_rq_issue",
    "block:block_rq_complete": "tracepoint__block__block_rq_complete",
    "tcp:tcp_retransmit_skb": "tracepoint__tcp__tcp_retransmit_skb",
}


def build(out_dir: Path) -> Path:
    exe = out_dir / "cuda_rate"
    lib = CUDA_HOME / "lib64"
    subprocess.run(
        ["gcc", "-O2", "-o", str(exe), str(Path(__file__).with_name("cuda_rate.c")),
         f"-I{CUDA_HOME}/include", f"-L{lib}", "-lcudart", f"-Wl,-rpath,{lib}"],
        check=True,
    )  # fmt: skip
    return exe


def run(exe: Path, spin: int, calls: int, call: str | None = None) -> float:
    """ns per iteration of ``exe`` (``call``: cuda_rate's third argument, where given)."""
    argv = [str(exe), str(spin), str(calls), *([call] if call else [])]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return float(out.split("=", 1)[1])


def calibrate(exe: Path, rate: int, call: str | None = None) -> int:
    """Spin rounds per iteration so that an untraced iteration lasts 1/rate s."""
    target = 1e9 / rate
    spin = 100
    for _ in range(6):
        per = run(exe, spin, 20000, call)
        base = run(exe, 0, 20000, call)
        per_spin = max((per - base) / spin, 1e-3)
        spin = max(1, int((target - base) / per_spin))
    return spin


def library() -> LibraryFile:
    path = os.path.realpath(CUDA_HOME / "lib64" / "libcudart.so")
    st = os.stat(path)
    return LibraryFile(CUDART, path, st.st_dev, st.st_ino)


class Config:
    def __init__(self, name: str) -> None:
        self.name = name

    def on(self) -> None: ...
    def off(self) -> None: ...


class Floor(Config):
    """Empty uprobes (BCC's perf-event uprobes) on the workload's functions: an entry and a
    return (``floor``), or the entry alone (``entry``)."""

    def __init__(
        self,
        bcc_bpf: type,
        path: str,
        symbols: tuple[bytes, ...] = CALLS["launch"],
        returns: bool = True,
    ) -> None:
        super().__init__("floor" if returns else "entry")
        self.bpf = bcc_bpf(text=FLOOR_PROGRAM.encode())
        self.path = path.encode()
        self.symbols = symbols
        self.returns = returns

    def on(self) -> None:
        for sym in self.symbols:
            self.bpf.attach_uprobe(name=self.path, sym=sym, fn_name=b"enter")
            if self.returns:
                self.bpf.attach_uretprobe(name=self.path, sym=sym, fn_name=b"leave")

    def off(self) -> None:
        for sym in self.symbols:
            self.bpf.detach_uprobe(name=self.path, sym=sym)
            if self.returns:
                self.bpf.detach_uretprobe(name=self.path, sym=sym)


class Ingero(Config):
    """ingero's program on every op of ``lib`` plus the host tracepoints. With ``poll_s``
    a thread reads the ring buffer that often while attached, as the tracer does."""

    def __init__(
        self,
        lib: LibraryFile | None = None,
        poll_s: float | None = None,
        stacks: bool = True,
        name: str | None = None,
        sample_every: int = DEFAULT_SAMPLE_EVERY,
        multi: bool = True,
        launch_returns: str = LAUNCH_AUTO,
        launch_reads: bool = True,
    ) -> None:
        super().__init__(name or ("ingero" if stacks else "no-stacks"))
        self.probes = load(stacks=stacks, sample_every=sample_every, uprobe_multi=multi,
                           launch_returns=launch_returns, launch_reads=launch_reads)  # fmt: skip
        self.lib = lib or library()
        self.attachments = self.probes.attach_library(self.lib)
        self.probes.open_ring(lambda data: None)
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self.off()

    def on(self) -> None:
        bpf, path = self.probes.bpf, self.lib.path.encode()
        if self.probes.multi:  # links again, as the tracer makes them
            self.probes.attached.clear()
            self.probes.attach_library(self.lib)
        for att in [] if self.probes.multi else self.attachments:
            sym = att.symbol.encode()
            enter, leave = probe_names(att, self.probes.sampled)
            bpf.attach_uprobe(name=path, sym=sym, fn_name=enter.encode())
            bpf.attach_uretprobe(name=path, sym=sym, fn_name=leave.encode())
        for tp, fn in TRACEPOINTS.items():
            bpf.attach_tracepoint(tp=tp.encode(), fn_name=fn.encode())
        if self.poll_s is not None:
            self._stop.clear()
            self._poller = threading.Thread(target=self._poll, daemon=True)
            self._poller.start()

    def _poll(self) -> None:
        assert self.poll_s is not None
        while not self._stop.wait(self.poll_s):
            self.probes.poll()

    def off(self) -> None:
        if self._poller is not None:
            self._stop.set()
            self._poller.join()
            self._poller = None
        bpf, path = self.probes.bpf, self.lib.path.encode()
        close_all(self.probes.links)
        self.probes.links.clear()
        if self.probes.multi:  # ops a link could not take went the BCC way
            for event in list(bpf.uprobe_fds):
                bpf.detach_uprobe_event(event)
        for att in [] if self.probes.multi else self.attachments:
            bpf.detach_uprobe(name=path, sym=att.symbol.encode())
            bpf.detach_uretprobe(name=path, sym=att.symbol.encode())
        for tp in TRACEPOINTS:
            bpf.detach_tracepoint(tp.encode())
        self.probes.poll()  # the reader's periodic poll, between runs


def measure(
    exe: Path,
    configs: list[Config],
    spin: int,
    calls: int,
    rounds: int,
    call: str | None = None,
) -> dict[str, float]:
    """Median ns per iteration of each configuration, run interleaved round by round."""
    results: dict[str, list[float]] = {c.name: [] for c in configs}
    for _ in range(rounds):
        for config in configs:
            config.on()
            try:
                results[config.name].append(run(exe, spin, calls, call))
            finally:
                config.off()
    return {k: statistics.median(v) for k, v in results.items()}


def other_tracers() -> int:
    """Processes besides this one holding BPF links or perf events (another tracer's uprobes
    on the same library would add their cost to every configuration, ``none`` included)."""
    found = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in ("anon_inode:bpf_link", "anon_inode:[perf_event]"):
                    found += 1
                    break
            except OSError:
                continue
    return found


def _added(med: dict[str, float], name: str) -> float:
    return med[name] - med["none"]


def _ratios(med: dict[str, float], name: str) -> str:
    """ns a configuration adds, and that beside the pair's and the entry uprobe's."""
    added, pair, entry = _added(med, name), _added(med, "floor"), _added(med, "entry")
    nan = float("nan")
    return (f"adds {added:.0f} ns ({added / pair if pair > 0 else nan:.2f}x the pair, "
            f"{added / entry if entry > 0 else nan:.2f}x the entry)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.4, help="length of one run")
    parser.add_argument("--rates", default="10000,50000,200000", help="'': back to back only")
    parser.add_argument("--calls", type=int, default=200000, help="back-to-back calls per run")
    parser.add_argument("--call", choices=sorted(CALLS), default="launch",
                        help="the workload's call (event: a record and a sync per iteration)")  # fmt: skip
    parser.add_argument("--more", action="store_true",
                        help="also perf-uprobes, no-stacks, no-samples and no-reads")  # fmt: skip
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp))
        ingero = Ingero()
        before = Ingero(name="before", launch_returns=LAUNCH_ALL)
        bcc_bpf = type(ingero.probes.bpf)
        floor = Floor(bcc_bpf, ingero.lib.path, CALLS[args.call])
        entry = Floor(bcc_bpf, ingero.lib.path, CALLS[args.call], returns=False)
        traced: list[Ingero] = [before, ingero]
        if args.more:
            traced += [
                Ingero(name="perf-uprobes", multi=False),
                Ingero(stacks=False),
                # No call sampled (and none slow): the per-call bookkeeping alone, without
                # the ring buffer samples and their stacks.
                Ingero(name="no-samples", sample_every=1 << 40),
                # What reading the launch's stream and return address from user memory
                # costs: launches counted at entry without it (no stream, no frame).
                Ingero(name="no-reads", launch_reads=False),
            ]
        configs: list[Config] = [Config("none"), entry, floor, *traced]
        names = [t.name for t in traced]
        print(
            f"# {time.strftime('%Y-%m-%d %H:%M:%S')} host={os.uname().nodename} "
            f"kernel={os.uname().release} cpus={os.cpu_count()} "
            f"load={' '.join(f'{x:.2f}' for x in os.getloadavg())} rounds={args.rounds} "
            f"call={args.call} "
            f"calls-in-flight={'task storage' if ingero.probes.task_storage else 'hash'} "
            f"launches: ingero={ingero.probes.launch_mode} before={before.probes.launch_mode} "
            f"other-tracers={other_tracers()}"
        )
        per_call = measure(exe, configs, 0, args.calls, args.rounds, args.call)
        parts = "  ".join(f"{n}: {_ratios(per_call, n)}" for n in names)
        print(
            f"per call (back to back, {args.calls} calls): none={per_call['none']:.0f} ns "
            f"entry adds {_added(per_call, 'entry'):.0f} ns, floor (the pair) adds "
            f"{_added(per_call, 'floor'):.0f} ns  {parts}"
        )
        for rate in (int(r) for r in args.rates.split(",") if r):
            spin = calibrate(exe, rate, args.call)
            med = measure(exe, configs, spin, int(rate * args.seconds), args.rounds, args.call)
            parts = "  ".join(
                f"{n}: slowdown={100 * _added(med, n) / med['none']:.2f}% ({_ratios(med, n)})"
                for n in names
            )
            print(
                f"rate={rate}/s  ns/iter: none={med['none']:.0f} "
                f"entry={100 * _added(med, 'entry') / med['none']:.2f}% "
                f"floor={100 * _added(med, 'floor') / med['none']:.2f}%  {parts}"
            )
        print(f"# done {time.strftime('%H:%M:%S')} "
              f"load={' '.join(f'{x:.2f}' for x in os.getloadavg())} "
              f"other-tracers={other_tracers()}")  # fmt: skip
        for t in traced:
            t.probes.close()
        floor.bpf.cleanup()
        entry.bpf.cleanup()


if __name__ == "__main__":
    main()
