"""probes.load in both variants (task-local storage, and the hash fallback), in-process."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ingero.trace.decode import KIND_CALL, decode
from ingero.trace.ops import CUDA, CUDART, NCCL, OP_IDS
from ingero.trace.probes import load
from ingero.trace.procmaps import LibraryFile

pytestmark = pytest.mark.integration
CUDA_HOME = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))


@pytest.mark.parametrize("task_storage", [True, False], ids=["task-storage", "hash"])
def test_both_variants_count_every_call(
    bpf_ready: None, cuda_loop: Path, task_storage: bool
) -> None:
    probes = load(sample_every=1, task_storage=task_storage)
    try:
        if task_storage and not probes.task_storage:
            pytest.skip("this kernel cannot load task-local storage; the hash variant ran")
        path = os.path.realpath(CUDA_HOME / "lib64" / "libcudart.so")
        st = os.stat(path)
        attached = probes.attach_library(LibraryFile(CUDART, path, st.st_dev, st.st_ino))
        assert {a.op.name for a in attached} >= {"cudaMalloc", "cudaLaunchKernel"}
        # Attaching the same file again is a no-op (no double probes).
        assert probes.attach_library(LibraryFile(CUDART, path, st.st_dev, st.st_ino)) == []
        samples: list[bytes] = []
        probes.open_ring(samples.append)
        proc = subprocess.Popen([str(cuda_loop), "250", "0"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)  # fmt: skip
        try:
            out, _ = proc.communicate("go\n", timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert "cudaMalloc=" in out
        probes.poll()
        snap, _ = probes.snapshot()
        pid = proc.pid  # other processes using this libcudart meanwhile are counted apart
        for op in ("cudaMalloc", "cudaFree", "cudaLaunchKernel", "cudaGraphLaunch"):
            stat = snap.stats[(pid, OP_IDS[op])]
            assert stat.count == 250 and stat.errors == 250, op
            assert sum(snap.hist[(pid, OP_IDS[op])].values()) == 250, op
        assert snap.stats[(pid, OP_IDS["cudaMalloc"])].bytes == 250 * 4096
        # sample_every=1: every call and the process start/exit arrive on the ring buffer.
        mine = [d for d in samples if decode(d).pid == pid]
        assert len(mine) == 9 * 250 + 2
        assert snap.host["dropped_events"] == 0
    finally:
        probes.close()


@pytest.mark.parametrize("task_storage", [True, False], ids=["task-storage", "hash"])
def test_nested_calls_each_return(
    bpf_ready: None, nccl_ranks: Path, driver_loop: Path, task_storage: bool
) -> None:
    """Traced calls nest: NCCL launches each collective's kernel through the driver API
    inside the collective (the stand-in calls the stand-in libcuda's cuLaunchKernel, as
    real NCCL calls cuLaunchKernelEx). The inner call's entry and return must leave the
    outer one in flight, so the collective still returns, with its number and a duration
    that holds the launch."""
    iters = 40
    probes = load(sample_every=1, task_storage=task_storage)
    try:
        if task_storage and not probes.task_storage:
            pytest.skip("this kernel cannot load task-local storage; the hash variant ran")
        libcuda = driver_loop.parent / "libcuda.so.1"
        for lib, path in ((NCCL, nccl_ranks.parent / "libnccl.so.2"), (CUDA, libcuda)):
            st = os.stat(path)
            assert probes.attach_library(LibraryFile(lib, str(path), st.st_dev, st.st_ino))
        samples: list[bytes] = []
        probes.open_ring(samples.append)
        env = dict(os.environ, FAKE_NCCL_LIBCUDA=str(libcuda))
        proc = subprocess.Popen([str(nccl_ranks), "0", "1", str(iters), "3"], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        try:
            out, _ = proc.communicate("go\n", timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert f"comm1_collectives={iters}" in out
        probes.poll()
        snap, _ = probes.snapshot()
        pid = proc.pid
        # the inner launches (failed by the stand-in driver) and the outer collectives
        assert snap.stats[(pid, OP_IDS["cuLaunchKernel"])].count == iters
        assert snap.stats[(pid, OP_IDS["ncclAllReduce"])].count == iters
        events = [e for e in map(decode, samples) if e.pid == pid]
        returns = sorted(e.seq for e in events if e.kind == KIND_CALL and e.op == "ncclAllReduce")
        assert returns == list(range(1, iters + 1))
        launch = {e.tid: e.duration_ns for e in events if e.op == "cuLaunchKernel"}
        assert all(
            e.duration_ns >= launch[e.tid]
            for e in events
            if e.kind == KIND_CALL and e.op == "ncclAllReduce"
        )
    finally:
        probes.close()


@pytest.mark.parametrize("task_storage", [True, False], ids=["task-storage", "hash"])
def test_a_driver_call_the_runtime_makes_is_counted_once(
    bpf_ready: None, runtime_loop: Path, task_storage: bool
) -> None:
    """The runtime calls the driver inside its own calls (cudaLaunchKernel through
    cuLaunchKernel): one launch, counted once, as the runtime call; launches the
    application makes through the driver itself are counted as driver calls."""
    n = 50
    probes = load(sample_every=1, task_storage=task_storage)
    try:
        if task_storage and not probes.task_storage:
            pytest.skip("this kernel cannot load task-local storage; the hash variant ran")
        libs = ((CUDART, runtime_loop.parent / "libcudart.so.13"),
                (CUDA, runtime_loop.parent / "libcuda.so.1"))  # fmt: skip
        for lib, path in libs:
            st = os.stat(path)
            assert probes.attach_library(LibraryFile(lib, str(path), st.st_dev, st.st_ino))
        probes.open_ring(lambda _: None)
        proc = subprocess.Popen([str(runtime_loop), str(n)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)  # fmt: skip
        try:
            out, _ = proc.communicate("go\n", timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert "done" in out
        probes.poll()
        snap, _ = probes.snapshot()
        counts = {op: snap.stats[(proc.pid, OP_IDS[op])].count
                  for op in ("cudaLaunchKernel", "cudaStreamSynchronize", "cuLaunchKernel")}  # fmt: skip
        assert counts == {"cudaLaunchKernel": n, "cudaStreamSynchronize": n, "cuLaunchKernel": n}
        assert (proc.pid, OP_IDS["cuStreamSynchronize"]) not in snap.stats
    finally:
        probes.close()
