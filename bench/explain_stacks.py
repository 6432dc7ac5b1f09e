"""``ingero explain`` on a large node DB with call stacks: seconds and memory stay bounded.

Run: ``.venv/bin/python -m bench.explain_stacks`` (``--events 1000000 --stacks 10000
--runs 3``). Writes a node DB through the tracer's own ``write_batch``: two 5-minute
windows of 5-second intervals for one process (kernel launches, syncs, copies, NCCL
all-reduces; allocator churn in the recent window, so a chain carries call sites), and
``--events`` sampled calls in the recent window, each with one of ``--stacks`` distinct
stacks (8 native and 16 Python frames each, a PyTorch-like depth; Zipf-like: a few hot
sites, a long tail). Then runs the real CLI (``ingero explain --json`` and ``ingero query
--sites``) on it and, for comparison, ``explain`` on the same DB without stacks (its
``stacks`` table and ``stack_key`` columns dropped: what node DB v3 holds), each under
``/usr/bin/time`` for wall seconds and peak RSS. Medians over ``--runs``.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ingero.nodedb.schema import connect
from ingero.nodedb.writer import Batch, write_batch
from ingero.schema.stacks import Frame, Stack
from tests.unit.stack_dbs import downgrade_to_v3

T0 = 1_700_000_000.0
TICK_S = 5.0
TICKS = 120
END = T0 + TICK_S * TICKS
PID = 4242
OPS = (  # (source, op, calls per tick, mean ns, share of the sampled calls)
    ("cuda_driver", "cuLaunchKernel", 97_500, 6_500, 0.80),
    ("cuda_runtime", "cudaDeviceSynchronize", 80, 20_000, 0.02),
    ("cuda_runtime", "cudaMemcpyAsync", 950, 119_000, 0.08),
    ("nccl", "ncclAllReduce", 200, 450_000, 0.05),
    ("cuda_driver", "cuMemAlloc", 1_100, 144_000, 0.05),  # recent window only: churn
)


def stack(i: int) -> Stack:
    native = tuple(
        Frame("native", f"at::native::kernel_{i % 97}_{d}", lib="/opt/torch/lib/libtorch_cuda.so",
              addr=0x7F00_0000_0000 + i * 64 + d, offset=d)
        for d in range(8)
    )  # fmt: skip
    py = tuple(
        Frame("py", f"layer_{(i + d) % 211}", f"/work/job/model_{d % 5}.py", 10 + (i * 7 + d) % 900)
        for d in range(16)
    )  # fmt: skip
    return Stack(native + py)


def intervals(i: int) -> list[dict[str, object]]:
    a, b = T0 + TICK_S * i, T0 + TICK_S * (i + 1)
    recent = i >= TICKS // 2
    rows: list[dict[str, object]] = []
    for source, op, n, mean, _ in OPS:
        if op == "cuMemAlloc" and not recent:
            continue
        rows.append(
            {"ts_start": a, "ts_end": b, "pid": PID, "job_id": "77", "rank": 0,
             "source": source, "op": op, "count": n * (7 if recent and op == "cuLaunchKernel"
                                                        else 10) // 10,
             "total_ns": n * mean, "p50_ns": mean,
             "p95_ns": mean * (3 if recent and op == "cudaDeviceSynchronize" else 2),
             "p99_ns": mean * 3, "errors": 0, "bytes": 0}
        )  # fmt: skip
    return rows


def build(path: Path, events: int, stacks: int, seed: int = 7) -> None:
    rnd = random.Random(seed)
    made = [stack(i) for i in range(stacks)]
    weights = [1.0 / (k + 1) for k in range(stacks)]  # Zipf: a few hot call sites
    db = connect(path)
    per_tick = events // (TICKS // 2)
    for i in range(TICKS):
        raw: list[dict[str, object]] = []
        used: dict[str, dict[str, object]] = {}
        a, b = T0 + TICK_S * i, T0 + TICK_S * (i + 1)
        if i >= TICKS // 2:
            ops = rnd.choices(OPS, weights=[o[4] for o in OPS], k=per_tick)
            picks = rnd.choices(range(stacks), weights=weights, k=per_tick)
            for j, ((source, op, _, mean, _), s) in enumerate(zip(ops, picks, strict=True)):
                key = made[s].key()
                raw.append(
                    {"ts": a + TICK_S * j / per_tick, "pid": PID, "tid": PID, "job_id": "77",
                     "rank": 0, "source": source, "op": op,
                     "duration_ns": int(mean * rnd.uniform(0.5, 1.5)), "ret": 0, "bytes": 0,
                     "detail": None, "stack_key": key}
                )  # fmt: skip
                if key not in used:
                    used[key] = {"stack_key": key, "frames": made[s].dumps(),
                                 "first_seen": a, "last_seen": b}  # fmt: skip
        write_batch(db, Batch(intervals=intervals(i), raw_events=raw, stacks=list(used.values())))
    db.conn.close()


def without_stacks(src: Path, dst: Path) -> None:
    downgrade_to_v3(src, dst)
    with sqlite3.connect(dst) as conn:
        conn.execute("VACUUM")


def timed(args: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MiB, stdout) of ``ingero ARGS`` under /usr/bin/time."""
    with tempfile.NamedTemporaryFile("r") as report:
        done = subprocess.run(
            ["/usr/bin/time", "-o", report.name, "-f", "%e %M",
             sys.executable, "-m", "ingero.cli.main", *args],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        wall, rss_kib = report.read().split()[-2:]
    return float(wall), int(rss_kib) / 1024, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--stacks", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--db", type=Path, help="Use (or build and keep) this node DB.")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path, plain = opts.db or Path(tmp) / "node.db", Path(tmp) / "plain.db"
        t = time.perf_counter()
        if not path.exists():
            build(path, opts.events, opts.stacks)
        built = time.perf_counter() - t
        without_stacks(path, plain)
        with sqlite3.connect(path) as conn:
            n_raw, n_stacks = conn.execute(
                "SELECT (SELECT COUNT(*) FROM raw_events), (SELECT COUNT(*) FROM stacks)"
            ).fetchone()
        print(f"node DB: {n_raw:,} raw_events, {n_stacks:,} stacks, "
              f"{path.stat().st_size / 2**20:,.0f} MiB (built in {built:.0f} s)")  # fmt: skip
        until = ["--until", str(END)]
        cases = {
            "explain --json, stacks": ["explain", "--db", str(path), *until, "--json"],
            "explain --json, no stacks (v3)": ["explain", "--db", str(plain), *until, "--json"],
            "explain (text), stacks": ["explain", "--db", str(path), *until],
            "query --sites": ["query", "--db", str(path), "--sites", "--json"],
        }
        for name, args in cases.items():
            runs = [timed(args) for _ in range(opts.runs)]
            wall = statistics.median(r[0] for r in runs)
            rss = statistics.median(r[1] for r in runs)
            print(f"{name:32} {wall:6.2f} s  {rss:6.0f} MiB peak RSS")
            if name.startswith("explain --json, stacks"):
                report = json.loads(runs[-1][2])
                top = report["chains"][0] if report["chains"] else None
                if top is not None:
                    print(f"  top chain: {top['headline'][:160]}…")
                print(f"  call sites: {len(report['call_sites'])}")


if __name__ == "__main__":
    main()
