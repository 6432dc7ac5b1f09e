"""Wall time of ``ingero check --health``, alone and as NHC's check_ingero runs it.

NHC gives all of a node's checks 30 s together (its TIMEOUT). The node DB holds
``--hours`` of NVML rows of ``--gpus`` GPUs at one row per GPU and second (what ``ingero
trace`` writes at its default interval), written through the node DB writer; the state file
holds an open straggler episode. Prints median and p95 wall milliseconds over ``--runs``
runs: a bare ``python -c pass``, ``ingero check --health`` (healthy node, then a node with a
lost GPU), and a whole NHC run with ``check_ingero`` as its one check (the vendored NHC,
``--nhc``, unpacked as the tests do).

Usage: ``.venv/bin/python -m bench.nhc_check [--runs 20] [--gpus 8] [--hours 1]
[--nhc ../shared/vendor/lbnl-nhc-1.4.3.tar.xz]``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ingero.collectors.nvml import GpuReading, NvmlReading
from ingero.nodedb.schema import connect
from ingero.nodedb.writer import Batch, write_batch
from ingero.schema import healthstate
from ingero.trace.gpusampler import reading_rows

REPO = Path(__file__).resolve().parents[1]
INGERO = Path(sys.executable).with_name("ingero")


def node_db(path: Path, gpus: int, hours: float, lost: bool) -> int:
    """An hour's NVML rows per GPU, one per second, ending now; returns the row count."""
    db = connect(path)
    now = time.time()
    seconds = int(hours * 3600)
    batch: list[dict[str, object]] = []
    for i in range(seconds):
        end = now - seconds + i + 1
        last = i == seconds - 1
        reading = NvmlReading(
            tuple(
                GpuReading(g, utilization=0.9, ecc_uncorrected=0, remap_pending=False,
                           xids=(), lost=lost and last and g == gpus - 1)
                for g in range(gpus)
            )
        )  # fmt: skip
        batch += reading_rows(reading, end - 1, end).intervals
        if len(batch) >= 20_000 or last:
            write_batch(db, Batch(gpu_intervals=batch))
            batch = []
    db.conn.close()
    return seconds * gpus


def timed(argv: list[str], runs: int, expect: int) -> str:
    walls = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        walls.append((time.perf_counter() - start) * 1000)
        if done.returncode != expect:
            raise SystemExit(f"{argv[:3]}: exit {done.returncode}, not {expect}: {done.stdout}")
    walls.sort()
    p95 = walls[min(len(walls) - 1, round(0.95 * (len(walls) - 1)))]
    return f"median {statistics.median(walls):7.1f} ms   p95 {p95:7.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument(
        "--nhc", type=Path, default=REPO.parent / "shared" / "vendor" / "lbnl-nhc-1.4.3.tar.xz"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rows = node_db(root / "ok.db", args.gpus, args.hours, lost=False)
        node_db(root / "lost.db", args.gpus, args.hours, lost=True)
        state = root / "health.json"
        now = time.time()
        episode = healthstate.Straggler("e", now - 60, "score", "77", 0.41, 0.87)
        state.write_bytes(healthstate.encode(
            healthstate.HealthState("n1", "c1", now + 3600, 5.0, "active", "fleet", episode)
        ))  # fmt: skip
        print(f"node DB: {rows:,} gpu_intervals rows ({args.gpus} GPUs x {args.hours:g} h at 1 s), "
              f"{(root / 'ok.db').stat().st_size / 2**20:.1f} MiB; {args.runs} runs each")  # fmt: skip
        print(
            f"python -c pass                       {timed([sys.executable, '-c', 'pass'], args.runs, 0)}"
        )
        check = [str(INGERO), "check", "--health", "--state-file", str(state), "--db"]
        print(
            f"ingero check --health (healthy)      {timed([*check, str(root / 'ok.db')], args.runs, 0)}"
        )
        print(
            f"ingero check --health (lost GPU)     {timed([*check, str(root / 'lost.db')], args.runs, 1)}"
        )
        if not args.nhc.exists():
            print(f"NHC: {args.nhc} is absent, not timed")
            return
        sys.path.insert(0, str(REPO))
        from tests.integration.nhc.nhc import install

        nhc = install(root / "nhc", args.nhc)
        conf = nhc.conf("nhc", f"* || check_ingero -- --db {root / 'ok.db'} --state-file {state}")
        argv = [*nhc.argv(conf), "MARK_OFFLINE=0"]
        print(f"nhc with check_ingero (healthy)      {timed(argv, args.runs, 0)}")
        empty = nhc.conf("empty", "")
        print(
            f"nhc with no check                    {timed([*nhc.argv(empty), 'MARK_OFFLINE=0'], args.runs, 0)}"
        )


if __name__ == "__main__":
    main()
