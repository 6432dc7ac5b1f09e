"""probes.load in both variants (task-local storage, and the hash fallback), in-process."""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ingero.trace.aggregate import OpInterval, Snapshot, op_intervals
from ingero.trace.bccload import load_bcc
from ingero.trace.decode import KIND_CALL, decode
from ingero.trace.ops import CUDA, CUDART, NCCL, OP_IDS
from ingero.trace.probes import Probes, load
from ingero.trace.procmaps import LibraryFile
from ingero.trace.symbols import Attachment
from ingero.trace.uprobemulti import BPF_TRACE_UPROBE_MULTI, kernel_has_links
from tests.integration.trace.conftest import REPO, cudart_of

pytestmark = pytest.mark.integration


@contextmanager
def loaded(
    task_storage: bool, uprobe_multi: bool = True, pid: int = -1, launch_returns: str = "auto"
) -> Iterator[Probes]:
    """The program in one variant, closed after; skips where task storage cannot load. In
    sampled mode every launch is timed (a gap of 1 ns between timed launches wanted): these
    tests count calls and samples one by one (test_trace_sampling.py samples)."""
    probes = load(sample_every=1, pid=pid, task_storage=task_storage, uprobe_multi=uprobe_multi,
                  launch_returns=launch_returns, launch_timed_per_s=10**9)  # fmt: skip
    try:
        if task_storage and not probes.task_storage:
            pytest.skip("this kernel cannot load task-local storage; the hash variant ran")
        yield probes
    finally:
        probes.close()


def calls(snap: Snapshot) -> dict[tuple[int, int], OpInterval]:
    """Each (pid, op) since the program loaded, as the tracer writes it: launches counted at
    entry joined with their timed sample (aggregate.op_intervals)."""
    return op_intervals(Snapshot({}, {}, {}), snap)


def programs(probes: Probes, attached: list[Attachment]) -> int:
    """Programs the attached ops take: a session program per launch in sampled mode, an
    entry and a return program per other op."""
    ops = {a.op_id: a.op for a in attached}
    return sum(1 if probes.sampled and op.launch else 2 for op in ops.values())


def bpf_links() -> set[int]:
    """This process's open BPF link fds (a uprobe_multi link is one)."""
    fds = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:bpf_link":
                fds.add(int(fd))
    return fds


def foreign_bpf_links(*mine: int) -> list[int]:
    """Other processes (not this one nor ``mine``) holding BPF links: another tracer."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in (os.getpid(), *mine):
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) == "anon_inode:bpf_link" for fd in (entry / "fd").iterdir()):
                pids.append(int(entry.name))
    return pids


def attach(probes: Probes, *libs: tuple[str, Path]) -> None:
    for lib, path in libs:
        st = os.stat(path)
        assert probes.attach_library(LibraryFile(lib, str(path), st.st_dev, st.st_ino))


def run(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run a workload that waits for a line on stdin; (its pid, what it printed)."""
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        out, _ = proc.communicate("go\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.pid, out


def release(probes: Probes, proc: subprocess.Popen[str]) -> tuple[list[bytes], Snapshot]:
    """Let a cuda_loop waiting on stdin run to its end: the samples it sent and the maps."""
    samples: list[bytes] = []
    probes.open_ring(samples.append)
    out, _ = proc.communicate("go\n", timeout=60)
    assert "cudaMalloc=" in out
    probes.poll()
    snap, _ = probes.snapshot()
    return samples, snap


@pytest.mark.parametrize(
    ("task_storage", "uprobe_multi", "launch_returns"),
    [(True, True, "auto"), (True, True, "all"), (False, True, "auto"), (True, False, "auto")],
    ids=["task-storage", "launch-returns-all", "hash", "perf-uprobes"],
)
def test_both_variants_count_every_call(
    bpf_ready: None, cuda_loop: Path, task_storage: bool, uprobe_multi: bool, launch_returns: str
) -> None:
    before = bpf_links()
    # The workload waits on stdin before its first call; the probes take its pid alone, so
    # another process calling this libcudart meanwhile (a tracer test beside this one) can
    # neither fill the ring nor be counted.
    proc = subprocess.Popen([str(cuda_loop), "200", "0"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    pid = proc.pid
    try:
        with loaded(task_storage, uprobe_multi, pid, launch_returns) as probes:
            # Launches are counted at entry (uprobe sessions, 6.13+) with task storage and
            # links, unless every launch is asked to take its return.
            sampled = task_storage and uprobe_multi and launch_returns == "auto"
            assert probes.sampled == sampled
            path = cudart_of(cuda_loop)
            st = os.stat(path)
            attached = probes.attach_library(LibraryFile(CUDART, path, st.st_dev, st.st_ino))
            assert {a.op.name for a in attached} >= {"cudaMalloc", "cudaLaunchKernel"}
            # This kernel (6.6+) has uprobe_multi: one link per program, entry and return
            # (a session program for a launch in sampled mode), but for programs whose
            # offset another tool's perf-event uprobe holds (a tracer beside this test),
            # which attach the BCC way from a copy.
            links = bpf_links() - before
            if uprobe_multi:
                assert len(links) == len(probes.links) > 0
                assert len(probes.links) + len(probes.perf_copies) == programs(probes, attached)
            else:
                assert not links and not probes.links and not probes.perf_copies
            # Attaching the same file again is a no-op (no double probes).
            assert probes.attach_library(LibraryFile(CUDART, path, st.st_dev, st.st_ino)) == []
            # the ring is read once, after the run, so the run's samples must fit it
            samples, snap = release(probes, proc)
            got = calls(snap)
            for op in ("cudaMalloc", "cudaFree", "cudaLaunchKernel", "cudaGraphLaunch"):
                o = got[(pid, OP_IDS[op])]
                assert o.stat.count == 200 and o.stat.errors == 200 and o.timed == 200, op
            for op in ("cudaLaunchKernel", "cudaGraphLaunch"):  # counted at entry
                assert ((pid, OP_IDS[op]) in snap.timed) == sampled
                assert ((pid, OP_IDS[op]) in snap.stats) != sampled
            assert snap.stats[(pid, OP_IDS["cudaMalloc"])].bytes == 200 * 4096
            # sample_every=1: every call and the process start/exit arrive on the ring buffer.
            mine = [d for d in samples if decode(d).pid == pid]
            assert len(mine) == 11 * 200 + 2
            assert snap.host["dropped_events"] == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert bpf_links() == before  # the stop closed every link


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
    with loaded(task_storage) as probes:
        libcuda = driver_loop.parent / "libcuda.so.1"
        attach(probes, (NCCL, nccl_ranks.parent / "libnccl.so.2"), (CUDA, libcuda))
        samples: list[bytes] = []
        probes.open_ring(samples.append)
        env = dict(os.environ, FAKE_NCCL_LIBCUDA=str(libcuda))
        pid, out = run([str(nccl_ranks), "0", "1", str(iters), "3"], env)
        assert f"comm1_collectives={iters}" in out
        probes.poll()
        snap, _ = probes.snapshot()
        # the inner launches (failed by the stand-in driver) and the outer collectives
        got = calls(snap)
        assert got[(pid, OP_IDS["cuLaunchKernel"])].stat.count == iters
        assert got[(pid, OP_IDS["ncclAllReduce"])].stat.count == iters
        events = [e for e in map(decode, samples) if e.pid == pid]
        returns = sorted(e.seq for e in events if e.kind == KIND_CALL and e.op == "ncclAllReduce")
        assert returns == list(range(1, iters + 1))
        launch = {e.tid: e.duration_ns for e in events if e.op == "cuLaunchKernel"}
        assert all(
            e.duration_ns >= launch[e.tid]
            for e in events
            if e.kind == KIND_CALL and e.op == "ncclAllReduce"
        )


@pytest.mark.parametrize(
    ("task_storage", "launch_returns"),
    [(True, "auto"), (True, "all"), (False, "auto")],
    ids=["task-storage", "launch-returns-all", "hash"],
)
def test_a_driver_call_the_runtime_makes_is_counted_once(
    bpf_ready: None, runtime_loop: Path, task_storage: bool, launch_returns: str
) -> None:
    """The runtime calls the driver inside its own calls (cudaLaunchKernel through
    cuLaunchKernel, cudaGraphLaunch through cuGraphLaunch): one launch, counted once, as
    the runtime call; launches the application makes through the driver itself are
    counted as driver calls. Counted at entry (sampled mode), the runtime launch leaves its
    frame for the driver launch it makes."""
    n = 50
    with loaded(task_storage, launch_returns=launch_returns) as probes:
        lib_dir = runtime_loop.parent
        attach(probes, (CUDART, lib_dir / "libcudart.so.13"), (CUDA, lib_dir / "libcuda.so.1"))
        probes.open_ring(lambda _: None)
        pid, out = run([str(runtime_loop), str(n)])
        assert "done" in out
        probes.poll()
        snap, _ = probes.snapshot()
        got = calls(snap)
        counts = {op: got[(pid, OP_IDS[op])].stat.count
                  for op in ("cudaLaunchKernel", "cudaStreamSynchronize", "cuLaunchKernel",
                             "cudaGraphLaunch", "cudaStreamBeginCapture",
                             "cudaStreamEndCapture", "cudaGraphInstantiate")}  # fmt: skip
        assert counts == {"cudaLaunchKernel": n, "cudaStreamSynchronize": n, "cuLaunchKernel": n,
                          "cudaGraphLaunch": n, "cudaStreamBeginCapture": 1,
                          "cudaStreamEndCapture": 1, "cudaGraphInstantiate": 1}  # fmt: skip
        for inner in ("cuStreamSynchronize", "cuGraphLaunch", "cuStreamBeginCapture",
                      "cuStreamEndCapture", "cuGraphInstantiate"):  # fmt: skip
            assert (pid, OP_IDS[inner]) not in got, inner


HOLDER = """
import sys, time
from ingero.trace.aggregate import Snapshot
from ingero.trace.bccload import load_bcc
bpf = load_bcc().BPF(text=b"int hit(struct pt_regs *ctx) { return 0; }")
bpf.attach_uprobe(name=sys.argv[1].encode(), sym=sys.argv[2].encode(), fn_name=b"hit")
print("held", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("held", ["cudaMalloc", "cudaLaunchKernel"])
def test_an_op_another_tools_uprobe_holds_attaches_the_perf_way_and_counts(
    bpf_ready: None, cuda_loop: Path, held: str
) -> None:
    """Another tool's perf-event uprobe on an op, and a process that maps libcudart: the
    kernel refuses a uprobe_multi link there (EINVAL), a session link too. That op alone
    attaches as a perf-event uprobe pair, from a second copy of its programs (a launch:
    timed at every call, as with --launch-returns all); every call is still counted."""
    path = cudart_of(cuda_loop)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, path, held], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=REPO)  # fmt: skip
    mapper = subprocess.Popen([str(cuda_loop), "200", "0"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        maps = Path(f"/proc/{mapper.pid}/maps")
        while "libcudart" not in maps.read_text():  # exec'd, its libraries mapped
            assert mapper.poll() is None
            time.sleep(0.01)
        with loaded(task_storage=True) as probes:
            st = os.stat(path)
            attached = probes.attach_library(LibraryFile(CUDART, path, st.st_dev, st.st_ino))
            names = {a.op.name for a in attached}
            assert {"cudaMalloc", "cudaFree", "cudaLaunchKernel"} <= names
            assert probes.links  # linked where the kernel let them
            assert probes.perf_copies  # the refused ones, the BCC way
            refused = f"enter_{OP_IDS[held]}".encode()
            # Which offsets the kernel refuses depends on every uprobe on the file: a tracer
            # beside this test whose links came before the holder's uprobe lets the op
            # link and has others refused instead.
            foreign = foreign_bpf_links(holder.pid, mapper.pid)
            assert refused in probes.perf_copies or foreign
            if not foreign:
                # The held op took a pair (entry and return copies), every other op its
                # program(s) through links.
                assert (
                    len(probes.links) + len(probes.perf_copies)
                    == programs(probes, [a for a in attached if a.op.name != held]) + 2
                )
            out, _ = mapper.communicate("go\n", timeout=60)
            assert "cudaMalloc=" in out
            snap, _ = probes.snapshot()
            got = calls(snap)
            for op in ("cudaMalloc", "cudaFree", "cudaLaunchKernel"):
                assert got[(mapper.pid, OP_IDS[op])].stat.count == 200, op
    finally:
        for proc in (mapper, holder):
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def test_the_kernel_says_whether_it_has_uprobe_multi_links(bpf_ready: None) -> None:
    """Asked through a program loaded with uprobe_multi's attach type, this kernel (6.6+)
    has the links; asked through a plain kprobe program it refuses with EINVAL, as a kernel
    before 6.6 refuses every program, and the answer is no."""
    bpf = load_bcc().BPF(text=b"int multi(void *ctx) { return 0; }\n"
                              b"int plain(void *ctx) { return 0; }")  # fmt: skip
    try:
        multi = bpf.load_func(b"multi", bpf.KPROBE, attach_type=BPF_TRACE_UPROBE_MULTI)
        plain = bpf.load_func(b"plain", bpf.KPROBE)
        assert kernel_has_links(multi.fd)
        assert not kernel_has_links(plain.fd)
    finally:
        bpf.cleanup()


@pytest.mark.parametrize("uprobe_multi", [True, False], ids=["links", "perf-uprobes"])
def test_a_stack_sample_with_no_stack_program_is_a_drop_and_the_calls_count(
    bpf_ready: None, cuda_loop: Path, uprobe_multi: bool
) -> None:
    """Samples with a stack are taken by a tail call into the stack program: with its slot
    empty the call does not happen, and each such sample is counted as dropped while every
    call is still counted (the process's start and exit, taken without a stack, arrive)."""
    proc = subprocess.Popen([str(cuda_loop), "50", "0"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        with loaded(True, uprobe_multi, proc.pid) as probes:
            path = cudart_of(cuda_loop)
            st = os.stat(path)
            assert probes.attach_library(LibraryFile(CUDART, path, st.st_dev, st.st_ino))
            for table in (b"stack_progs", b"stack_progs_multi", b"stack_progs_session"):
                with contextlib.suppress(KeyError):  # the links' copies: where they loaded
                    del probes.bpf[table][ctypes.c_int(0)]
            samples, snap = release(probes, proc)
            got = calls(snap)
            for op in ("cudaMalloc", "cudaFree", "cudaLaunchKernel", "cudaGraphLaunch"):
                assert got[(proc.pid, OP_IDS[op])].stat.count == 50, op
            mine = [e for e in map(decode, samples) if e.pid == proc.pid]
            assert [e.native for e in mine] == [None, None]
            assert snap.host["dropped_events"] == 11 * 50
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
