"""What a mark costs the training loop, and how many lines a second the annotate server takes.

A real ``ingero annotate serve`` (its rate bound raised out of the way) on a temporary socket
and node DB; this process is the job. Prints the median, p99 and max time of one
``Annotator.step`` call (µs) with the server reading, and with no server at all (the mark is
dropped); then the lines per second the server wrote to the node DB when the job marks as
fast as it can, and whether every mark arrived.

    .venv/bin/python bench/annotate.py [--marks 20000]
"""

from __future__ import annotations

import argparse
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ingero.annotate.client import Annotator


def timed_steps(annotator: Annotator, marks: int) -> list[float]:
    took = []
    for i in range(marks):
        t = time.perf_counter()
        annotator.step(i)
        took.append(time.perf_counter() - t)
    return took


def report(name: str, took: list[float], annotator: Annotator) -> None:
    us = sorted(t * 1e6 for t in took)
    p99 = us[int(len(us) * 0.99)]
    print(
        f"{name:<28} median {statistics.median(us):6.1f} µs  p99 {p99:6.1f} µs"
        f"  max {us[-1]:8.1f} µs  (sent {annotator.sent}, dropped {annotator.dropped})"
    )


def marks_in(db: Path) -> int:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM marks").fetchone()[0])
    except sqlite3.Error:
        return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--marks", type=int, default=20000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sock, db, log = Path(tmp) / "a.sock", Path(tmp) / "n.db", Path(tmp) / "serve.log"
        argv = [sys.executable, "-m", "ingero.cli.main", "annotate", "serve", "--socket",
                str(sock), "--db", str(db), "--lines-per-s", "1000000", "--burst", "1000000",
                "--uid-lines-per-s", "1000000", "--uid-burst", "1000000",
                "--flush", "0.5"]  # fmt: skip
        with log.open("w") as out:
            server = subprocess.Popen(argv, stderr=out)
        try:
            while "listening on" not in log.read_text():
                time.sleep(0.05)
            paced = Annotator(sock)
            took = []
            for i in range(args.marks // 10):  # a loop of ~1,000 steps/s
                t = time.perf_counter()
                paced.step(i)
                took.append(time.perf_counter() - t)
                time.sleep(0.001)
            report("step(), server reading", took, paced)
            paced.close()
            while marks_in(db) < paced.sent:  # the paced marks written before counting on
                time.sleep(0.05)
            absent = Annotator(Path(tmp) / "none")
            report("step(), no server", timed_steps(absent, 2000), absent)
            before = marks_in(db)
            burst = Annotator(sock)
            start = time.perf_counter()
            took = timed_steps(burst, args.marks)
            burst.close()
            report("step(), as fast as it can", took, burst)
            want = before + burst.sent
            while marks_in(db) < want and time.perf_counter() - start < 120:
                time.sleep(0.05)
            elapsed = time.perf_counter() - start
            got = marks_in(db) - before
            print(
                f"server: {got} of {burst.sent} marks sent in the node DB after {elapsed:.2f} s"
                f" ({got / elapsed:,.0f} lines/s, flushed every 0.5 s)"
            )
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
