"""Launches counted at entry with a sample timed (uprobe sessions), on the real program.

Counts are exact with sampling on, on each stream, and a driver launch the runtime makes
inside its launch is not counted again; the timed sample's duration distribution is the
launches': ``launch_mix.c`` makes a known share of slow launches (the stand-in driver spins:
a launch that waits for a full queue), and the sample's weighted share of slow ones agrees
with it within five standard errors of a sample of its size. Fast and slow are told apart by
30 times the sample's p25 (a ratio within the run, no timing asserted). The real
libcudart's launches (the CUDA 13 toolkit's; without a driver they fail after their probes
fired) count exactly too, and so do the runtime's own driver launches beside another
tracer's return probe on the runtime's launch.
"""

from __future__ import annotations

import math
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ingero.trace.aggregate import Snapshot, op_intervals, percentile, slot_bounds, stream_rows
from ingero.trace.bccload import load_bcc
from ingero.trace.decode import KIND_CALL, decode
from ingero.trace.ops import CUDA, CUDART, OP_IDS
from ingero.trace.probes import Probes, load
from ingero.trace.procmaps import LibraryFile
from tests.integration.trace.conftest import cudart_of

pytestmark = pytest.mark.integration
N = 20_000
SLOW_PERCENT = 20
SPIN = 300_000


def traced(
    argv: list[str], libs: list[tuple[str, Path]], stacks: bool = True, timed_per_s: int = 2000
) -> tuple[int, str, Snapshot, list[bytes]]:
    """Run a workload waiting on stdin under the sampled program (its pid alone, so another
    process calling these libraries is not counted): (pid, what it printed, the maps after
    it ended, its ring samples). Skips where launches are not sampled here."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        probes = load(sample_every=64, pid=proc.pid, stacks=stacks,
                      launch_timed_per_s=timed_per_s)  # fmt: skip
        try:
            if not probes.sampled:
                pytest.skip(f"launches are not sampled here: {probes.launch_why}")
            for kind, path in libs:
                attach(probes, kind, path)
            samples: list[bytes] = []
            probes.open_ring(samples.append)
            out, _ = proc.communicate("go\n", timeout=120)
            probes.poll()
            snap, _ = probes.snapshot()
        finally:
            probes.close()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    return proc.pid, out, snap, samples


def attach(probes: Probes, kind: str, path: Path) -> None:
    st = os.stat(path)
    assert probes.attach_library(LibraryFile(kind, str(path), st.st_dev, st.st_ino))


def said(out: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in out.split())


def slow_share(hist: dict[int, int]) -> tuple[float, int]:
    """The weight at or above 30 times the p25 (a fast launch: 80% are), and that bound. A
    slow launch spins ~100 us, ~60 times a fast one here: a fast launch delayed up to 30
    times counts fast, a slow one preempted (a busy host) still slow."""
    bound = 30 * percentile(hist, 0.25)
    total = sum(hist.values())
    return sum(n for s, n in hist.items() if slot_bounds(s)[0] >= bound) / total, bound


def test_counts_are_exact_and_the_sample_is_the_launches(bpf_ready: None, launch_mix: Path) -> None:
    lib = launch_mix.parent
    pid, out, snap, samples = traced(
        [str(launch_mix), str(N), str(SLOW_PERCENT), str(SPIN)],
        [(CUDART, lib / "libcudart.so.13"), (CUDA, lib / "libcuda.so.1")],
    )
    got = said(out)
    empty = Snapshot({}, {}, {})
    launches = int(got["launches_a"]) + int(got["launches_b"])
    slow = int(got["slow_a"]) + int(got["slow_b"])
    ops = op_intervals(empty, snap)
    runtime = ops[(pid, OP_IDS["cudaLaunchKernel"])]
    # Exact: every launch, none of the runtime's own driver launches, each on its stream.
    assert runtime.stat.count == launches == N
    assert ops[(pid, OP_IDS["cuLaunchKernel"])].stat.count == int(got["launches_c"])
    streams = {r["stream"]: r["launches"] for r in stream_rows(empty, snap, 0.0, 1.0, {})
               if r["pid"] == pid}  # fmt: skip
    assert streams == {got["stream_a"]: int(got["launches_a"]),
                       got["stream_b"]: int(got["launches_b"]),
                       got["stream_c"]: int(got["launches_c"])}  # fmt: skip
    # A sample was timed, not every launch; every launch failed (the stand-in driver's
    # error), and the scaled errors say so.
    n = runtime.timed
    assert 100 <= n < launches
    assert runtime.stat.errors == launches
    # The sample's weighted share of slow launches is the launches' share, within five
    # standard errors of a sample of n (and 1% for fast launches preempted on a busy host).
    share, bound = slow_share(dict(runtime.hist))
    truth = slow / launches
    error = 5 * math.sqrt(truth * (1 - truth) / n) + 0.01
    assert abs(share - truth) <= error, (share, truth, n)
    # 20% slow: the median launch is a fast one, the p95 a slow one.
    assert percentile(runtime.hist, 0.5) < bound <= percentile(runtime.hist, 0.95)
    # Timed launches keep their stacks: the raw samples carry the caller's frames.
    timed = [e for e in map(decode, samples)
             if e.pid == pid and e.kind == KIND_CALL and e.op == "cudaLaunchKernel"]  # fmt: skip
    assert timed and all(e.duration_ns > 0 for e in timed)
    assert any(e.native for e in timed)


def test_the_real_runtime_counts_exactly_with_sampling_on(bpf_ready: None, cuda_loop: Path) -> None:
    iterations = 3000
    runtime = Path(cudart_of(cuda_loop))
    pid, out, snap, _ = traced([str(cuda_loop), str(iterations), "0"], [(CUDART, runtime)],
                               stacks=False, timed_per_s=256)  # fmt: skip
    assert "cudaLaunchKernel=" in out
    ops = op_intervals(Snapshot({}, {}, {}), snap)
    for op in ("cudaLaunchKernel", "cudaGraphLaunch"):
        o = ops[(pid, OP_IDS[op])]
        assert o.stat.count == o.stat.errors == iterations, op
        assert 0 < o.timed < iterations, op
    # The other ops keep entry and return: every call timed.
    sync = ops[(pid, OP_IDS["cudaStreamSynchronize"])]
    assert sync.stat.count == sync.timed == iterations


@contextmanager
def another_tracer(kind: str, runtime: Path) -> Iterator[None]:
    """Another tracer's return probe on ``runtime``'s cudaLaunchKernel, every process's:
    a second ingero timing every launch (its session's return takes the launch's return
    slot), or a BCC perf-event uretprobe (its ref_ctr_offset differs from a link's: the
    kernel refuses the first tracer's session link there with EINVAL)."""
    if kind == "ingero":
        other = load(sample_every=64, stacks=False, launch_timed_per_s=10**9)
        try:
            assert other.sampled, other.launch_why
            attach(other, CUDART, runtime)
            yield
        finally:
            other.close()
        return
    bpf = load_bcc().BPF(text=b"int ret(void *ctx) { return 0; }")
    try:
        bpf.attach_uretprobe(name=str(runtime).encode(), sym=b"cudaLaunchKernel", fn_name=b"ret")
        yield
    finally:
        bpf.cleanup()


@pytest.mark.parametrize("kind", ["ingero", "perf-uretprobe"])
def test_beside_another_tracers_return_probe_the_runtimes_driver_launches_count_once(
    bpf_ready: None, launch_mix: Path, kind: str
) -> None:
    lib = launch_mix.parent
    with another_tracer(kind, lib / "libcudart.so.13"):
        pid, out, snap, _ = traced([str(launch_mix), "5000", "0", "0"],
                                   [(CUDART, lib / "libcudart.so.13"), (CUDA, lib / "libcuda.so.1")],
                                   stacks=False)  # fmt: skip
    got = said(out)
    ops = op_intervals(Snapshot({}, {}, {}), snap)
    assert ops[(pid, OP_IDS["cudaLaunchKernel"])].stat.count == 5000
    assert ops[(pid, OP_IDS["cuLaunchKernel"])].stat.count == int(got["launches_c"]) == 500
