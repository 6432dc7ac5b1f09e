"""Detection latency of the real ``ingero demo`` (real processes on loopback), over several runs.

Each run starts Fleet, a sink and N workloads + fleet-push agents, slows one random node
down and waits for its straggler event. Prints, per run, the latency in push intervals and
any healthy node flagged, then the median and p95 over the runs that detected. With
``--cause`` the slowdown comes from that cause, and each run also says whether the node's
``ingero explain`` named it first.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--slowdown", type=float, default=0.2)
    parser.add_argument("--push-interval", type=float, default=1.0)
    parser.add_argument("--tracer-interval", type=float, default=None,
                        help="the workloads write their node DB this often (s)")  # fmt: skip
    parser.add_argument("--warmup", type=float, default=8.0)
    parser.add_argument("--cause", default=None, help="cpu, io, alloc, throttle or net")
    args = parser.parse_args()
    extra = ["--cause", args.cause] if args.cause else []
    if args.tracer_interval is not None:
        extra += ["--tracer-interval", str(args.tracer_interval)]
    named = 0

    latencies: list[float] = []
    failures = 0
    false_flags = 0
    for run in range(args.runs):
        done = subprocess.run(
            [
                sys.executable, "-m", "ingero.cli.main", "demo", "--no-live",
                "--nodes", str(args.nodes), "--slowdown", str(args.slowdown),
                "--push-interval", str(args.push_interval), "--warmup", str(args.warmup),
                "--duration", str(30 * args.push_interval), "--seed", str(run), *extra,
            ],
            capture_output=True,
            text=True,
            check=False,
        )  # fmt: skip
        out = done.stdout + done.stderr
        match = re.search(r"detected: (node-\d+) after [\d.]+ s = ([\d.]+) push intervals", out)
        flagged = re.search(r"also flagged \(false positives\): (.*)", out)
        if flagged:
            false_flags += len(flagged.group(1).split(","))
        verdict = re.search(r"explain names the injected cause \((.*)\): (yes|no)", out)
        explained = ""
        if verdict:
            named += verdict.group(2) == "yes"
            top = re.search(r"^  1\. (.+?) \(", out, re.MULTILINE)
            explained = f"; explain: {top.group(1) if top else 'no chain'} first"
        if match:
            latencies.append(float(match.group(2)))
            print(
                f"run {run}: {match.group(1)} detected after {match.group(2)} push intervals"
                + explained
            )
        else:
            failures += 1
            reason = out.strip().splitlines()[-1] if out.strip() else "no output"
            print(f"run {run}: not detected ({reason})")
    print(
        f"{args.nodes} nodes, {args.slowdown:.0%} slowdown"
        + (f" from {args.cause}" if args.cause else "")
        + f", push interval {args.push_interval:g} s"
        + (f", tracer interval {args.tracer_interval:g} s" if args.tracer_interval else "")
        + ": "
        f"{len(latencies)}/{args.runs} detected, {false_flags} healthy nodes flagged"
        + (f", explain named the cause first in {named}/{args.runs}" if args.cause else "")
    )
    if latencies:
        ordered = sorted(latencies)
        p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
        print(
            f"latency in push intervals: median {statistics.median(ordered):.2f}, "
            f"p95 {p95:.2f}, max {ordered[-1]:.2f}"
        )
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
