"""Build the BPF program from bpf/ingero.bpf.c and the op table, attach it, read its maps."""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ingero.trace.aggregate import HOST_COUNTERS, Key, Snapshot, StatVal, StreamKey, StreamVal
from ingero.trace.bccload import load_bcc
from ingero.trace.nativesyms import NativeSymbols
from ingero.trace.ops import (
    CUDA,
    CUDART,
    OP_COMM_DESTROY,
    OP_COMM_INIT,
    OP_OFFCPU,
    OPS,
    STREAM_KINDS,
    ops_for_lib,
)
from ingero.trace.procmaps import LibraryFile
from ingero.trace.pyframes.layout import Layout
from ingero.trace.symbols import Attachment, bcc_symbol_table, select

BPF_DIR_ENV = "INGERO_BPF_DIR"
BPF_SOURCE = "ingero.bpf.c"
DEFAULT_SAMPLE_EVERY = 64
# A call at least this long is sampled with its stack whatever the sampling counter says.
DEFAULT_STACK_SLOW_MS = 10.0


class ProbeError(RuntimeError):
    """The BPF program could not be compiled, loaded or attached."""


def bpf_source_path() -> Path:
    """bpf/ingero.bpf.c: ``$INGERO_BPF_DIR``, the source tree, or the installed share dir."""
    candidates = []
    if os.environ.get(BPF_DIR_ENV):
        candidates.append(Path(os.environ[BPF_DIR_ENV]))
    candidates.append(Path(__file__).resolve().parents[2] / "bpf")
    candidates.append(Path(sys.prefix) / "share" / "ingero" / "bpf")
    candidates.append(Path("/usr/share/ingero/bpf"))
    for directory in candidates:
        if (directory / BPF_SOURCE).is_file():
            return directory / BPF_SOURCE
    raise ProbeError(f"{BPF_SOURCE} not found (looked in {', '.join(map(str, candidates))})")


def _op_mask(lib: str) -> int:
    """The ops of ``lib`` as a bit mask by op id (the program tells a driver call made by
    the runtime from one the application made)."""
    mask = sum(1 << i for i, op in enumerate(OPS) if op.lib == lib)
    if mask >> 64:
        raise ValueError(f"{lib} op ids past 63 do not fit the program's 64-bit mask")
    return mask


def program_text(
    source: str,
    sample_every: int = DEFAULT_SAMPLE_EVERY,
    stacks: bool = True,
    stack_slow_ms: float = DEFAULT_STACK_SLOW_MS,
) -> str:
    """The C source plus one PROBE_PAIR per generic op (special ops are hand-written)."""
    if sample_every < 1:
        raise ValueError("sample_every must be at least 1")
    if stack_slow_ms < 0:
        raise ValueError("stack_slow_ms must not be negative")
    head = (
        f"#define SAMPLE_EVERY {sample_every}\n#define OP_OFFCPU {OP_OFFCPU}\n"
        f"#define STACKS {int(stacks)}\n#define STACK_SLOW_NS {int(stack_slow_ms * 1e6)}ULL\n"
        f"#define OP_COMM_INIT {OP_COMM_INIT}\n#define OP_COMM_DESTROY {OP_COMM_DESTROY}\n"
        f"#define RUNTIME_OPS {_op_mask(CUDART)}ULL\n#define DRIVER_OPS {_op_mask(CUDA)}ULL\n"
    )
    pairs = [
        f"PROBE_PAIR({i}, {op.bytes_arg}, {op.count_arg}, {op.dtype_arg}, {op.comm_arg}, "
        f"{int(op.always_sample)}, {int(op.numbered)}, {op.stream_arg}, "
        f"{STREAM_KINDS[op.stream_kind]})"
        for i, op in enumerate(OPS)
        if op.symbols and not op.special
    ]
    return head + source + "\n" + "\n".join(pairs) + "\n"


def probe_names(att: Attachment) -> tuple[str, str]:
    """Entry and return BPF function names of an attachment."""
    if att.op.special == "comm_init":
        return "enter_comm_init", "leave_comm_init"
    if att.op.special == "comm_destroy":
        return "enter_comm_destroy", "leave_comm_destroy"
    return f"enter_{att.op_id}", f"leave_{att.op_id}"


@dataclass
class Probes:
    """The loaded program and what is attached where."""

    bpf: Any
    pid: int = -1
    task_storage: bool = False
    attached: dict[tuple[int, int], list[Attachment]] = field(default_factory=dict)
    native: NativeSymbols = field(default_factory=NativeSymbols)
    _until: float = math.inf  # monotonic time the current poll stops reading at

    def attach_library(self, lib: LibraryFile) -> list[Attachment]:
        """Attach every op of ``lib`` once (by path: later processes are caught too)."""
        key = (lib.dev, lib.inode)
        if key in self.attached:
            return []
        table = bcc_symbol_table(type(self.bpf), lib.path)
        chosen = select(ops_for_lib(lib.kind), table)
        done = []
        for att in chosen:
            enter, leave = probe_names(att)
            try:
                # BCC wants bytes (str is deprecated there).
                path, sym = lib.path.encode(), att.symbol.encode()
                self.bpf.attach_uprobe(name=path, sym=sym, fn_name=enter.encode(), pid=self.pid)
                self.bpf.attach_uretprobe(name=path, sym=sym, fn_name=leave.encode(), pid=self.pid)
            except Exception as exc:  # BCC raises bare Exception on attach failures
                print(f"ingero trace: {lib.path}:{att.symbol}: {exc}", file=sys.stderr)
                continue
            done.append(att)
        self.attached[key] = done
        return done

    def mark_traced(self, pids: list[int]) -> None:
        """Processes whose threads' off-CPU time is measured."""
        table = self.bpf[b"traced"]
        for pid in pids:
            table[table.Key(pid)] = table.Leaf(1)

    def forget(self, pids: set[int]) -> None:
        """Drop kernel state of exited processes (after their last interval was read)."""
        table = self.bpf[b"stats"]
        for k in [k for k in table if k.tgid in pids]:
            with contextlib.suppress(KeyError):
                del table[k]
        streams = self.bpf[b"streams"]
        for k in [k for k in streams if k.tgid in pids]:
            with contextlib.suppress(KeyError):
                del streams[k]
        traced = self.bpf[b"traced"]
        for pid in pids:
            with contextlib.suppress(KeyError):
                del traced[traced.Key(pid)]
        for pid in pids:
            self.native.forget(pid)
        comms = self.bpf[b"comms"]  # communicators a process never destroyed
        for k in [k for k in comms if k.tgid in pids]:
            with contextlib.suppress(KeyError):
                del comms[k]

    def set_python(
        self,
        pid: int,
        layout: Layout,
        tstates: dict[int, int],
        interp: int = 0,
        pthread_tid: int | None = None,
    ) -> None:
        """Let the program walk ``pid``'s Python frames: its layout, its threads' states,
        and its main interpreter (where the program looks up a thread not mapped yet).
        ``pthread_tid``: 3.10, which keeps no kernel tid in the thread state, only a
        pthread_t: where glibc's struct pthread holds the tid (none known: no lookup)."""
        table = self.bpf[b"py_layouts"]
        w = layout.window()
        tid = layout.tstate_native_thread_id
        through_pthread = -1
        if tid is None and pthread_tid is not None:
            tid, through_pthread = layout.tstate_thread_id, pthread_tid
        leaf = table.Leaf(
            layout.tstate_frame,
            -1 if layout.cframe_current_frame is None else layout.cframe_current_frame,
            w.start,
            w.length,
            layout.frame_previous - w.start,
            layout.frame_code - w.start,
            layout.frame_instr - w.start,
            -1 if layout.frame_owner is None else layout.frame_owner - w.start,
            -1 if layout.shim_owner is None else layout.shim_owner,
            layout.interp_threads_head if interp and tid is not None else -1,
            layout.tstate_next,
            -1 if tid is None else tid,
            through_pthread,
            0,
            interp if tid is not None else 0,
        )
        table[table.Key(pid)] = leaf
        threads = self.bpf[b"py_tstates"]
        for t, tstate in tstates.items():
            threads[threads.Key(t)] = threads.Leaf(tstate)

    def forget_python(self, pid: int, tids: set[int]) -> None:
        for name, keys in ((b"py_layouts", [pid]), (b"py_tstates", sorted(tids))):
            table = self.bpf[name]
            for k in keys:
                with contextlib.suppress(KeyError):
                    del table[table.Key(k)]

    def symbol(self, pid: int, addr: int) -> tuple[str | None, int | None, str | None]:
        """(function, offset in it, library path) of a user address (``nativesyms``: the
        process's maps, read again for a library loaded later, and the file's ELF symbols)."""
        return self.native.resolve(pid, addr)

    def snapshot(self) -> tuple[Snapshot, dict[int, int]]:
        """Cumulative stats, histograms and host counters, plus the block I/O histogram."""
        stats: dict[Key, StatVal] = {}
        hist: dict[Key, dict[int, int]] = {}
        for k, v in self.bpf[b"stats"].items():
            stats[(k.tgid, k.op)] = StatVal(v.count, v.total_ns, v.errors, v.bytes)
            hist[(k.tgid, k.op)] = {i: int(n) for i, n in enumerate(v.slots) if n}
        streams: dict[StreamKey, StreamVal] = {}
        for k, v in self.bpf[b"streams"].items():
            streams[(k.tgid, k.stream)] = StreamVal(
                v.syncs, v.sync_ns, v.launches, v.steps, v.step_ns,
                {i: int(n) for i, n in enumerate(v.slots) if n},
            )  # fmt: skip
        host_table = self.bpf[b"host"]
        host = {
            name: int(sum(host_table[host_table.Key(i)])) for i, name in enumerate(HOST_COUNTERS)
        }
        bio = {int(k.value): int(v.value) for k, v in self.bpf[b"bio_hist"].items() if v.value}
        return Snapshot(stats, hist, host, streams), bio

    def open_ring(self, callback: Callable[[bytes], None]) -> None:
        import ctypes

        def _cb(_ctx: Any, data: Any, size: int) -> int:
            callback(ctypes.string_at(data, size))
            # libbpf stops consuming at a negative return, this sample read. Without it a
            # reader slower than the probes (a launch-bound job on a real GPU, stacks on)
            # never returns from one consume while the job runs: no interval closes.
            return -1 if time.monotonic() > self._until else 0

        self.bpf[b"events"].open_ring_buffer(_cb)

    def poll(self, budget_s: float | None = None) -> None:
        """Consume pending samples (the program never wakes us per event): all of them, or
        those read within ``budget_s``; the rest wait in the ring for the next poll, and
        what the full ring refuses is counted as dropped."""
        self._until = math.inf if budget_s is None else time.monotonic() + budget_s
        self.bpf.ring_buffer_consume()

    def close(self) -> None:
        self.bpf.cleanup()


def load(
    sample_every: int = DEFAULT_SAMPLE_EVERY,
    pid: int = -1,
    task_storage: bool = True,
    stacks: bool = True,
    stack_slow_ms: float = DEFAULT_STACK_SLOW_MS,
) -> Probes:
    """Compile and load the program (host tracepoints attach automatically).

    Calls in flight live in task-local storage where the kernel allows it (BTF, 5.11+),
    else in a hash map: same results, about 250 ns more per call.
    """
    bcc = load_bcc()
    text = program_text(bpf_source_path().read_text(), sample_every, stacks, stack_slow_ms)
    variants = [["-DUSE_TASK_STORAGE"], []] if task_storage else [[]]
    error: Exception | None = None
    for flags in variants:
        try:
            bpf = bcc.BPF(text=text.encode(), cflags=["-Wno-macro-redefined", *flags])
        except Exception as exc:  # compile/verifier errors arrive as bare Exception
            error = exc
            continue
        return Probes(bpf, pid, task_storage=bool(flags))
    raise ProbeError(f"cannot load the BPF program: {error}")
