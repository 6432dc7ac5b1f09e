"""Cost of one node health sample: the pure score, the node DB window read, the whole sampler.

Builds a node DB holding 10 minutes of synthetic workload rows (the retention the workload
generator keeps; 4 flushes a second), then times each step. Prints microseconds per call.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ingero.nodedb.schema import connect
from ingero.nodedb.window import read_window
from ingero.push.sampler import NodeSampler
from ingero.push.score import ScoreConfig, ScoreInputs, compute_score
from ingero.runtime.clock import ManualClock
from ingero.workload.generator import WorkloadGenerator, WorkloadProfile
from ingero.workload.runner import SyntheticProc


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Median and p95 of ``repeat`` calls, in microseconds."""
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    samples.sort()
    return statistics.median(samples), samples[int(0.95 * (len(samples) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0, help="minutes of rows in the DB")
    parser.add_argument("--window", type=float, default=5.0, help="sample window (push interval)")
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        db = connect(root / "node.db")
        gen = WorkloadGenerator(WorkloadProfile(), seed=1)
        proc = SyntheticProc(root / "proc")
        clock = ManualClock()
        step = 0.25
        for _ in range(int(args.minutes * 60 / step)):
            start = clock.now()
            clock.advance(step)
            rows = gen.tick(start, clock.now())
            db.table("intervals").insert_all(rows.intervals)
            db.table("gpu_intervals").insert_all(rows.gpu_intervals)
            db.table("gpu_processes").insert_all(rows.gpu_processes)
            db.table("host_intervals").insert_all(rows.host_intervals)
        db.conn.commit()
        proc.write(1.0, 0.3, 0.6)
        n_rows = db.execute("SELECT COUNT(*) FROM intervals").fetchone()[0]
        db.conn.close()

        inputs = ScoreInputs(
            throughput_rate=1900.0,
            throughput_baseline=2000.0,
            gpu_busy_fraction=0.8,
            mem_free_fraction=0.6,
            cpu_busy_fraction=0.3,
            rates={"kernel_launch_rate": 1900.0, "step_rate": 9.5},
        )
        config = ScoreConfig(proc_root=str(root / "proc"))
        score = timed(lambda: compute_score(inputs, config), args.repeat * 10)
        window = timed(lambda: read_window(root / "node.db", clock.now(), args.window), args.repeat)
        sampler = NodeSampler(
            node_id="bench",
            db_path=root / "node.db",
            config=config,
            window_s=args.window,
            clock=clock,
            baseline_path=root / "baselines.json",
        )
        whole = timed(sampler.sample, args.repeat)

    print(f"node DB: {n_rows} interval rows ({args.minutes:g} min), window {args.window:g} s")
    print(f"compute_score        median {score[0]:8.1f} us  p95 {score[1]:8.1f} us")
    print(f"read_window          median {window[0]:8.1f} us  p95 {window[1]:8.1f} us")
    print(
        f"NodeSampler.sample   median {whole[0]:8.1f} us  p95 {whole[1]:8.1f} us"
        "  (window read + /proc + score + baseline save with fsync)"
    )


if __name__ == "__main__":
    main()
