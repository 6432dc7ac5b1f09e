"""probes.load in both variants (task-local storage, and the hash fallback), in-process."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ingero.trace.decode import decode
from ingero.trace.ops import CUDART, OP_IDS
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
