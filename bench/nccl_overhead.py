"""Tracer cost per NCCL collective with the collective bookkeeping, beside the uprobe floor.

The workload (``bench/nccl_rate.c``) calls ``ncclAllReduce`` on a live communicator of the
tests' stand-in libnccl (one rank: a call returns at once), so every call takes ingero's
full NCCL path: the communicator lookup and the sequence number at entry, the arrival
sample, the return sample (both through the ring buffer without a wake-up), the
(process, op) aggregates. Configurations, interleaved round after round, each run a fresh
process (as ``bench/trace_overhead.py``):

- ``none``: no probes;
- ``floor``: an empty entry + return uprobe pair on ncclAllReduce;
- ``ingero``: ingero's program on every NCCL symbol plus the host tracepoints, with a
  thread reading the ring buffer every 50 ms as ``ingero trace`` does.

Back-to-back calls outrun any reader (two 88-byte samples per call fill the 256 KiB ring
within about 1,490 calls), so the ring's failed reservations are counted and printed: the
long back-to-back run mostly measures the failed-reservation path. The short one (1,200
calls, fewer than the ring holds) writes every sample, as do the paced rates (default
10,000 and 2,000 collectives/s), where the cost is a small difference of long iterations
and so noisier. Needs root, BCC, gcc and NCCL's header (the tests' cache, or --nccl-dir).
Usage: ``python bench/nccl_overhead.py [--rounds 7]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.trace_overhead import CUDA_HOME, Config, Floor, Ingero, calibrate, measure
from ingero.trace.ops import NCCL
from ingero.trace.procmaps import LibraryFile

REPO = Path(__file__).resolve().parents[1]
FAKE_NCCL = REPO / "tests" / "integration" / "trace" / "fake_libnccl.c"
DEFAULT_NCCL_DIR = Path.home() / ".cache" / "ingero-tests" / "nccl"


def build(out: Path, nccl_dir: Path) -> tuple[Path, LibraryFile]:
    inc = [f"-I{nccl_dir}/include", f"-I{CUDA_HOME}/include"]
    lib = out / "libnccl.so.2"
    # -O0: the collectives start with a push, as the real libnccl's do (its ncclAllReduce
    # begins "push %r15"); the kernel emulates that first instruction. At -O2 they begin with
    # a register move, which must be single-stepped out of line: a floor ~10x higher.
    subprocess.run(["gcc", "-O0", "-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", "-o", str(lib),
                    str(FAKE_NCCL), *inc], check=True)  # fmt: skip
    exe = out / "nccl_rate"
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(Path(__file__).with_name("nccl_rate.c")),
                    *inc, str(lib), f"-Wl,-rpath,{out}"], check=True)  # fmt: skip
    st = os.stat(lib)
    return exe, LibraryFile(NCCL, str(lib), st.st_dev, st.st_ino)


def drops(ingero: Ingero) -> int:
    snap, _ = ingero.probes.snapshot()
    return int(snap.host.get("dropped_events", 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.5, help="length of one paced run")
    parser.add_argument("--rates", default="10000,2000")
    parser.add_argument("--calls", type=int, default=100000, help="back-to-back calls per run")
    parser.add_argument("--short-calls", type=int, default=1200,
                        help="back-to-back calls per run that the ring buffer holds")  # fmt: skip
    parser.add_argument("--nccl-dir", type=Path, default=Path(
        os.environ.get("INGERO_TEST_NCCL_DIR", DEFAULT_NCCL_DIR)), help="holds include/nccl.h")  # fmt: skip
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        exe, lib = build(Path(tmp), args.nccl_dir)
        ingero = Ingero(lib, poll_s=0.05)
        floor = Floor(type(ingero.probes.bpf), lib.path, (b"ncclAllReduce",))
        configs = [Config("none"), floor, ingero]
        print(
            f"# {time.strftime('%Y-%m-%d %H:%M:%S')} host={os.uname().nodename} "
            f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f} rounds={args.rounds} "
            f"calls-in-flight={'task storage' if ingero.probes.task_storage else 'hash'}"
        )
        runs: list[tuple[str, int, int]] = [
            ("back to back", 0, args.calls),
            ("back to back, short", 0, args.short_calls),
        ]
        for rate in (int(r) for r in args.rates.split(",") if r.strip()):
            runs.append((f"{rate}/s", calibrate(exe, rate), int(rate * args.seconds)))
        for label, spin, calls in runs:
            before = drops(ingero)
            # Short runs are cheap and noisy: three times the rounds.
            rounds = args.rounds * (3 if calls == args.short_calls else 1)
            med = measure(exe, configs, spin, calls, rounds)
            lost = drops(ingero) - before
            added = med["ingero"] - med["none"]
            floor_added = med["floor"] - med["none"]
            ratio = added / floor_added if floor_added > 0 else float("nan")
            print(
                f"{label}: ns/call none={med['none']:.0f} floor={med['floor']:.0f} "
                f"ingero={med['ingero']:.0f}  added: floor={floor_added:.0f} ns "
                f"ingero={added:.0f} ns  ratio={ratio:.2f}x  "
                f"samples dropped={lost} of {2 * calls * rounds}"
            )
        ingero.probes.close()
        floor.bpf.cleanup()


if __name__ == "__main__":
    main()
