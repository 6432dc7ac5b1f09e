"""What fleet-push would have scored on a node DB recorded by ``ingero trace`` on a real node.

Replays the DB in simulated time: one sample every ``--push`` seconds from its first host
row to its last, by fleet-push's own sampler (``NodeSampler.sample``: the window read, node
state, stall, baselines, GPU health, score), as a lone node sees it (its own baselines; no
Fleet, no peers). The recorded node's /proc was not kept, so the CPU signal is missing and
host memory reads as this machine's. Prints one line per sample (state, score, signals, the
raw rates) and, with ``--mark T`` (a wall-clock time, e.g. when a slowdown began), the
median score and throughput signal before and after it.

    python -m bench.node_replay tests/data/h200/decode.db --push 1
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
from pathlib import Path

from ingero.collectors.procfs import ProcReader
from ingero.push.config import PushConfig
from ingero.push.sampler import NodeSample, NodeSampler
from ingero.runtime.clock import ManualClock


class UnrecordedCpu(ProcReader):
    """The recorded node's CPU is unknown: no reading (the signal is missing, not guessed)."""

    def cpu_busy_fraction(self) -> float | None:
        return None


def replay(db: Path, push: float, proc: ProcReader | None = None) -> list[NodeSample]:
    """One sample per push interval over the DB's rows, in order (``proc``: the host's
    readings, this machine's memory and no CPU unless given)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        first, last = con.execute(
            "SELECT min(ts_start), max(ts_end) FROM host_intervals"
        ).fetchone()
    if first is None:
        raise SystemExit(f"{db}: no host_intervals rows (the tracer wrote nothing)")
    # A push lands just after the tracer's interval ends, as on a node.
    clock = ManualClock(first + push + 0.05)
    sampler = NodeSampler(
        node_id=db.stem,
        db_path=db,
        config=PushConfig().score,
        window_s=push,
        clock=clock,
        proc=proc if proc is not None else UnrecordedCpu(),
        pid_alive=lambda pid: True,  # the recorded processes ran until the DB's end
    )
    samples = []
    while clock.now() <= last + 0.06:
        samples.append(sampler.sample())
        clock.advance(push)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("db", type=Path, help="node DB written by ingero trace")
    parser.add_argument("--push", type=float, default=1.0, help="push interval, seconds")
    parser.add_argument("--mark", type=float, default=None, help="wall-clock time to split at")
    args = parser.parse_args()
    samples = replay(args.db, args.push)
    start = samples[0].timestamp - args.push - 0.05
    for s in samples:
        r = s.result
        signals = {k: round(v, 2) for k, v in r.signals.items()} if r else {}
        rates = {k: round(v, 3) if v < 10 else round(v) for k, v in r.rates.items()} if r else {}
        after = args.mark is not None and s.timestamp > args.mark
        print(
            f"{'*' if after else ' '}+{s.timestamp - start:5.1f}s {s.state:11} "
            f"score {s.score:.3f}{' held' if s.held else ''}{' STALLED' if s.stalled else ''}"
            f" {signals} {rates}"
        )
    if args.mark is not None:
        for name, part in (
            ("before", [s for s in samples if s.timestamp <= args.mark]),
            ("after", [s for s in samples if s.timestamp > args.mark]),
        ):
            scored = [s for s in part if s.result is not None and not s.held]
            if not scored:
                print(f"{name} the mark: no scored samples")
                continue
            thr = [s.result.signals.get("throughput", float("nan")) for s in scored if s.result]
            print(
                f"{name} the mark: {len(scored)} samples, median score "
                f"{statistics.median(s.score for s in scored):.3f}, median throughput signal "
                f"{statistics.median(thr):.3f}"
            )


if __name__ == "__main__":
    main()
