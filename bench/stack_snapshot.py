"""Cost of fleet-push's stack snapshot: one py-spy dump of a CPython process with N threads.

Starts a process whose threads each sleep a few calls deep (a DataLoader-like pool), then
times ``ingero.push.stack_snapshot.dump`` of it (py-spy --nonblocking, the default; --native with
``--native``), frozen with SIGSTOP too, and the whole event (dump, fit into max_bytes, JSON).
Prints the median and p95 in milliseconds per thread count, and the event's size.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

from ingero.push.stack_snapshot import Target, dump, find_py_spy, fit

WORKER = """
import sys, threading, time
def inner(i):
    time.sleep(3600)
def middle(i):
    inner(i)
def outer(i):
    middle(i)
for i in range(int(sys.argv[1]) - 1):
    threading.Thread(target=outer, args=(i,), name=f"worker-{i}", daemon=True).start()
print("ready", flush=True)
outer(-1)
"""


def timed(fn: object, repeat: int) -> tuple[float, float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        samples.append((time.perf_counter() - start) * 1e3)
    samples.sort()
    return statistics.median(samples), samples[int(0.95 * (len(samples) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--native", action="store_true", help="py-spy --native (pauses)")
    args = parser.parse_args()
    py_spy = find_py_spy()
    if py_spy is None:
        sys.exit("py-spy is not installed")
    mode = "--native" if args.native else "--nonblocking"
    print(f"py-spy {mode}, {args.repeat} dumps per row; ms per dump of one process")
    print("| threads | running: median | p95 | SIGSTOPped: median | p95 | event bytes |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in args.threads:
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(n)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
            time.sleep(0.5)  # every thread into its sleep
            target = Target(proc.pid, 0)

            def one(target: Target = target, n: int = n) -> list[object]:
                threads = dump(target, py_spy=py_spy, native=args.native, timeout_s=30)
                assert len(threads) == n, threads[:1]
                return list(threads)

            running = timed(one, args.repeat)
            os.kill(proc.pid, signal.SIGSTOP)
            try:
                stopped: tuple[float, float] | str = timed(one, args.repeat)
            except AssertionError:
                # --native attaches with ptrace, which a SIGSTOPped process does not allow
                stopped = dump(target, py_spy=py_spy, native=args.native)[0].stack.reason or "?"
            finally:
                os.kill(proc.pid, signal.SIGCONT)
            kept, _ = fit(dump(target, py_spy=py_spy, native=args.native), 10_000)
            size = len(json.dumps([t.to_json() for t in kept], separators=(",", ":")))
        finally:
            proc.kill()
            proc.wait()
        frozen = (
            f"{stopped[0]:.1f} | {stopped[1]:.1f}"
            if isinstance(stopped, tuple)
            else f"{stopped} | -"
        )
        print(f"| {n} | {running[0]:.1f} | {running[1]:.1f} | {frozen} | {size} |")


if __name__ == "__main__":
    main()
