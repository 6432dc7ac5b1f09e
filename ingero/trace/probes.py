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

from ingero.trace import sessions, tailcall
from ingero.trace.aggregate import (
    HOST_COUNTERS,
    Key,
    LaunchKey,
    Snapshot,
    StatVal,
    StreamKey,
    StreamVal,
)
from ingero.trace.bccload import load_bcc
from ingero.trace.facilities import LAUNCH_ALL, LAUNCH_AUTO, LAUNCH_SAMPLED, Facilities
from ingero.trace.facilities import probe as probe_facilities
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
from ingero.trace.uprobemulti import (
    BPF_TRACE_UPROBE_MULTI,
    close_all,
    kernel_has_links,
    link_create,
)

BPF_DIR_ENV = "INGERO_BPF_DIR"
BPF_SOURCE = "ingero.bpf.c"
DEFAULT_SAMPLE_EVERY = 64
# A call at least this long is sampled with its stack whatever the sampling counter says.
DEFAULT_STACK_SLOW_MS = 10.0
# Sampled launches: about this many launches a second are timed per (process, op, stream),
# whatever the launch rate (bpf/ingero.bpf.c, LAUNCH_PROBE): a thousand timed
# launches an interval give its launch percentiles the error of a thousand-call sample
# (bench/launch_sampling.py), and below 64 x this many launches a second a launch is sampled
# to the ring (--sample-every 64) as often as with every launch timed.
DEFAULT_LAUNCH_TIMED_PER_S = 1024
# As in bpf/ingero.bpf.c: the flags in the keys of the timed launches and of the launches.
OP_TIMED = 1 << 15
LAUNCH_NAMED = 1 << 16


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
    launch_sessions: bool = False,
    launch_timed_per_s: int = DEFAULT_LAUNCH_TIMED_PER_S,
    launch_reads: bool = True,
    trampoline: tuple[int, ...] = (),
) -> str:
    """The C source plus one PROBE_ENTRY per generic op (special ops are hand-written) and,
    with ``launch_sessions``, one LAUNCH_PROBE per launch-class op (a uprobe session
    program: needs the task-storage variant, ``-DUSE_TASK_STORAGE``)."""
    if sample_every < 1:
        raise ValueError("sample_every must be at least 1")
    if stack_slow_ms < 0:
        raise ValueError("stack_slow_ms must not be negative")
    if launch_timed_per_s < 1:
        raise ValueError("launch_timed_per_s must be at least 1")
    head = (
        f"#define SAMPLE_EVERY {sample_every}\n#define OP_OFFCPU {OP_OFFCPU}\n"
        f"#define STACKS {int(stacks)}\n#define STACK_SLOW_NS {int(stack_slow_ms * 1e6)}ULL\n"
        f"#define OP_COMM_INIT {OP_COMM_INIT}\n#define OP_COMM_DESTROY {OP_COMM_DESTROY}\n"
        f"#define RUNTIME_OPS {_op_mask(CUDART)}ULL\n#define DRIVER_OPS {_op_mask(CUDA)}ULL\n"
    )
    pairs = [
        f"PROBE_ENTRY({i}, {op.bytes_arg}, {op.count_arg}, {op.dtype_arg}, {op.comm_arg}, "
        f"{int(op.numbered)}, {op.stream_arg}, "
        f"{STREAM_KINDS[op.stream_kind]}, {op.stream_offset}, {op.event_arg})"
        for i, op in enumerate(OPS)
        if op.symbols and not op.special
    ]
    if launch_sessions:
        placeholders = sessions.KFUNC_PLACEHOLDERS
        head += (
            f"#define LAUNCH_SESSIONS 1\n#define LAUNCH_GAP_NS {10**9 // launch_timed_per_s}ULL\n"
            f"#define KFUNC_SESSION_IS_RETURN {placeholders[sessions.IS_RETURN]:#x}\n"
            f"#define KFUNC_SESSION_COOKIE {placeholders[sessions.COOKIE]:#x}\n"
        )
        if trampoline:  # sessions.TRAMPOLINE's offsets
            head += "".join(f"#define TRAMPOLINE_{i} {o}\n" for i, o in enumerate(trampoline))
        if not launch_reads:  # a benchmark's diagnosis only (bench/trace_overhead.py)
            head += "#define LAUNCH_NO_READS 1\n"
        pairs += [
            f"LAUNCH_PROBE({i}, {op.stream_arg}, {op.stream_offset}, {int(op.lib == CUDART)})"
            for i, op in enumerate(OPS)
            if op.launch
        ]
    return head + source + "\n" + "\n".join(pairs) + "\n"


def probe_names(att: Attachment, sampled: bool = False) -> tuple[str, str]:
    """Entry and return BPF function names of an attachment; with ``sampled`` (launches in
    sampled mode) a launch's session program and no return program ("")."""
    if att.op.special == "comm_init":
        return "enter_comm_init", "leave_comm_init"
    if att.op.special == "comm_destroy":
        return "enter_comm_destroy", "leave_comm_destroy"
    if sampled and att.op.launch:
        return f"launch_{att.op_id}", ""
    # One return program for all generic ops (bpf/ingero.bpf.c, PROBE_ENTRY).
    return f"enter_{att.op_id}", "leave_always" if att.op.always_sample else "leave_sampled"


@dataclass
class Probes:
    """The loaded program and what is attached where."""

    bpf: Any
    pid: int = -1
    task_storage: bool = False
    attached: dict[tuple[int, int], list[Attachment]] = field(default_factory=dict)
    native: NativeSymbols = field(default_factory=NativeSymbols)
    # Libraries attach through uprobe_multi links (uprobemulti.py: a stop in about a
    # second, where perf-event uprobes take 0.1 s each) unless this is off; it turns off
    # at the first refused link where the kernel has no such links.
    multi: bool = True
    links: list[int] = field(default_factory=list)
    # Programs loaded a second time, without uprobe_multi's attach type, for the offsets
    # a link could not take (BCC caches one program per name): name -> BCC Function.
    perf_copies: dict[bytes, Any] = field(default_factory=dict)
    _multi_names: set[bytes] = field(default_factory=set)  # programs loaded for uprobe_multi
    # Whether the kernel has uprobe_multi links, asked at the first refused link (None: no
    # link refused yet).
    _kernel_links: bool | None = None
    # Samples carry stacks: the probes tail-call stack_sample (bpf/ingero.bpf.c), and a
    # probe loaded for a link calls its uprobe_multi copy, loaded at the first link
    # (tailcall.py; None: not yet, -1: it did not load, so no link is tried).
    stacks: bool = False
    _multi_sampler: int | None = None
    _until: float = math.inf  # monotonic time the current poll stops reading at
    # How launches are probed (facilities.py: sampled | all) and why; in sampled mode the
    # kernel's session attach type and kfunc ids, and the session copy of the stack walk.
    launch_mode: str = LAUNCH_ALL
    launch_why: str = ""
    kfuncs: sessions.SessionKfuncs | None = None
    _session_sampler: int | None = None

    @property
    def sampled(self) -> bool:
        return self.launch_mode == LAUNCH_SAMPLED and self.kfuncs is not None

    def attach_library(self, lib: LibraryFile) -> list[Attachment]:
        """Attach every op of ``lib`` once (by path: later processes are caught too)."""
        key = (lib.dev, lib.inode)
        if key in self.attached:
            return []
        table = bcc_symbol_table(type(self.bpf), lib.path)
        chosen = select(ops_for_lib(lib.kind), table)
        self.attached[key] = self._attach(lib.path, chosen)
        return self.attached[key]

    def _attach(self, path: str, chosen: list[Attachment]) -> list[Attachment]:
        """Each program at all its offsets in ``path``, entry and return: one uprobe_multi
        link each, or, where ``multi`` is off or the kernel refuses the link, BCC's
        perf-event uprobes, one per symbol. The kernel refuses a link on a kernel before
        6.6, which has no uprobe_multi, and on 6.18 (EINVAL) at an offset where another
        tool's perf-event uprobe sits while a process maps the file. Returns the
        attachments whose entry and return both took, in ``chosen``'s order."""
        bpf_class = type(self.bpf)
        offsets: dict[tuple[str, str], list[tuple[Attachment, int]]] = {}
        for att in chosen:
            try:
                _, offset = bpf_class._check_path_symbol(path.encode(), att.symbol.encode(), 0, -1)
            except Exception as exc:  # BCC raises bare Exception when it cannot resolve
                self._refused(path, att, exc)
                continue
            offsets.setdefault(probe_names(att, self.sampled), []).append((att, int(offset)))
        done: set[int] = set()
        for (enter, leave), where in offsets.items():
            if not leave:  # a launch's session program: entry and return in one link
                if self._link_session(path, enter, where):
                    done.update(id(att) for att, _ in where)
                    continue
                # Refused (another tool's perf-event uprobe at an offset, 6.18): this op of
                # this file is timed at every call, as in --launch-returns all.
                enter, leave = probe_names(where[0][0])
            linked = {retprobe for name, retprobe in ((enter, False), (leave, True))
                      if self._link(path, name, where, retprobe)}  # fmt: skip
            for att, _ in where:
                try:
                    for name, retprobe in ((enter, False), (leave, True)):
                        if retprobe not in linked:
                            self._perf(path, name, att, retprobe)
                except Exception as exc:  # BCC raises bare Exception on attach failures
                    self._refused(path, att, exc)
                    continue
                done.add(id(att))
        return [att for att in chosen if id(att) in done]

    @staticmethod
    def _refused(path: str, att: Attachment, exc: Exception) -> None:
        print(f"ingero trace: {path}:{att.symbol}: {exc}", file=sys.stderr)

    def _link(
        self, path: str, name: str, where: list[tuple[Attachment, int]], retprobe: bool
    ) -> bool:
        """One uprobe_multi link for program ``name`` at every offset of ``where``; False
        where ``multi`` is off or the kernel refuses the link."""
        key = name.encode()
        # BCC caches one program per name: one cached and not loaded here is BCC's own
        # perf-event program (this name's uprobe_multi load failed before).
        if not self.multi or (key in self.bpf.funcs and key not in self._multi_names):
            return False
        try:
            fn = self._load_multi(key)
        except Exception:  # BCC raises bare Exception when a program cannot load
            return False
        self._multi_names.add(key)
        try:
            self.links.append(link_create(fn.fd, path.encode(), [o for _, o in where],
                                          retprobe, 0 if self.pid == -1 else self.pid))  # fmt: skip
        except OSError:
            # A kernel before 6.6 refuses every link: asked once, at the first refusal, so
            # that no later program is loaded twice (a uprobe_multi program no link takes,
            # then its perf-event copy); this program attaches the BCC way from the start.
            if self._kernel_links is None:
                self._kernel_links = kernel_has_links(fn.fd)
                if not self._kernel_links:
                    self.multi = False
                    self._multi_names.discard(key)
                    with contextlib.suppress(OSError):
                        os.close(self.bpf.funcs.pop(key).fd)
            return False
        return True

    def _link_session(self, path: str, name: str, where: list[tuple[Attachment, int]]) -> bool:
        """One uprobe session link for launch program ``name`` at every offset of
        ``where``; False where the program does not load or the kernel refuses the link."""
        assert self.kfuncs is not None
        if not self.multi:
            return False
        try:
            fn = self._load_session(name.encode())
            self.links.append(link_create(fn.fd, path.encode(), [o for _, o in where], False,
                                          0 if self.pid == -1 else self.pid,
                                          attach_type=self.kfuncs.attach_type))  # fmt: skip
        except Exception as exc:  # BCC raises bare Exception when a program cannot load
            print(f"ingero trace: {path}: {name}: no session link ({exc}); its launches are "
                  "timed at every call", file=sys.stderr)  # fmt: skip
            return False
        return True

    def _load_session(self, key: bytes) -> Any:
        """Launch program ``key`` as a uprobe session program: the session attach type, its
        kfunc calls patched in (sessions.py), its tail call through the session copy of the
        stack walk (loaded the first time)."""
        assert self.kfuncs is not None
        if key in self.bpf.funcs:
            return self.bpf.funcs[key]
        kfuncs, at = self.kfuncs, self.kfuncs.attach_type
        if self.stacks and self._session_sampler is None:
            self._session_sampler = tailcall.link_multi_sampler(
                self.bpf, at, tailcall.STACK_PROGS_SESSION
            )

        def patch(insns: bytes) -> bytes:
            out, n = sessions.patch_kfuncs(insns, kfuncs.ids())
            if n == 0:
                raise ProbeError(f"{key.decode()}: no session kfunc call to patch")
            return out

        array = tailcall.STACK_PROGS_SESSION if self.stacks else None
        return tailcall.load_multi(self.bpf, key, at, array, patch)

    def _load_multi(self, key: bytes) -> Any:
        """Program ``key`` with uprobe_multi's attach type (with stacks, its tail call
        pointed at the uprobe_multi copy of the stack walk, loaded the first time)."""
        if key in self.bpf.funcs:  # a return program shared by several ops, loaded once
            return self.bpf.funcs[key]
        if not self.stacks:
            return self.bpf.load_func(key, type(self.bpf).KPROBE,
                                      attach_type=BPF_TRACE_UPROBE_MULTI)  # fmt: skip
        if self._multi_sampler is None:
            try:
                self._multi_sampler = tailcall.link_multi_sampler(self.bpf, BPF_TRACE_UPROBE_MULTI)
            except Exception:
                self._multi_sampler = -1
                raise
        if self._multi_sampler < 0:
            raise OSError(f"no uprobe_multi copy of {tailcall.STACK_SAMPLER.decode()}")
        return tailcall.load_multi(self.bpf, key, BPF_TRACE_UPROBE_MULTI)

    def _perf(self, path: str, name: str, att: Attachment, retprobe: bool) -> None:
        """Program ``name`` at ``att``'s symbol as a BCC perf-event uprobe. Where ``name``
        is cached as a uprobe_multi program, a perf-event copy is loaded and cached under
        the name while BCC attaches it, then put aside, so that later libraries still find
        the uprobe_multi program there."""
        funcs, key = self.bpf.funcs, name.encode()
        attach = self.bpf.attach_uretprobe if retprobe else self.bpf.attach_uprobe
        # BCC wants bytes (str is deprecated there).
        args = {"name": path.encode(), "sym": att.symbol.encode(), "fn_name": key, "pid": self.pid}
        if key not in self._multi_names:
            attach(**args)
            return
        multi_fn = funcs.pop(key)
        if key in self.perf_copies:
            funcs[key] = self.perf_copies[key]
        try:
            attach(**args)
        finally:
            if key in funcs:
                self.perf_copies[key] = funcs.pop(key)
            funcs[key] = multi_fn

    def mark_traced(self, pids: list[int]) -> None:
        """Processes whose threads' off-CPU time is measured."""
        table = self.bpf[b"traced"]
        for pid in pids:
            table[table.Key(pid)] = table.Leaf(1)

    def forget(self, pids: set[int]) -> None:
        """Drop kernel state of exited processes (after their last interval was read)."""
        # Every map keyed by process: counters, streams, communicators a process never
        # destroyed, and its events' streams (the LRU would age those out, but a new process
        # given the same pid must not find a dead one's events).
        for name in (b"stats", b"streams", b"event_streams", b"comms",
                     *((b"launches", b"launch_rates") if self.sampled else ())):  # fmt: skip
            table = self.bpf[name]
            for k in [k for k in table if k.tgid in pids]:
                with contextlib.suppress(KeyError):
                    del table[k]
        traced = self.bpf[b"traced"]
        for pid in pids:
            with contextlib.suppress(KeyError):
                del traced[traced.Key(pid)]
        for pid in pids:
            self.native.forget(pid)

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
        timed: dict[Key, StatVal] = {}
        timed_hist: dict[Key, dict[int, int]] = {}
        for k, v in self.bpf[b"stats"].items():
            # The timed launches (sampled mode) are kept under their op with OP_TIMED set:
            # weighted counts, and ``bytes`` is how many were timed (bpf/ingero.bpf.c).
            into, into_hist = (timed, timed_hist) if k.op & OP_TIMED else (stats, hist)
            key = (k.tgid, k.op & ~OP_TIMED)
            into[key] = StatVal(v.count, v.total_ns, v.errors, v.bytes)
            into_hist[key] = {i: int(n) for i, n in enumerate(v.slots) if n}
        entries: dict[LaunchKey, int] = {}
        if self.sampled:
            for k, per_cpu in self.bpf[b"launches"].items():
                stream = k.stream if k.op & LAUNCH_NAMED else None
                entries[(k.tgid, k.op & 0xFFFF, stream)] = sum(int(c.count) for c in per_cpu)
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
        return Snapshot(stats, hist, host, streams, timed, timed_hist, entries), bio

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
        close_all(self.links)
        self.links.clear()
        self.bpf.cleanup()
        for fn in self.perf_copies.values():
            with contextlib.suppress(OSError):
                os.close(fn.fd)
        self.perf_copies.clear()
        for sampler in (self._multi_sampler, self._session_sampler):
            if sampler is not None and sampler >= 0:
                with contextlib.suppress(OSError):
                    os.close(sampler)
        self._multi_sampler = self._session_sampler = None


def load(
    sample_every: int = DEFAULT_SAMPLE_EVERY,
    pid: int = -1,
    task_storage: bool = True,
    stacks: bool = True,
    stack_slow_ms: float = DEFAULT_STACK_SLOW_MS,
    uprobe_multi: bool = True,
    launch_returns: str = LAUNCH_AUTO,
    launch_timed_per_s: int = DEFAULT_LAUNCH_TIMED_PER_S,
    facilities: Facilities | None = None,
    launch_reads: bool = True,
) -> Probes:
    """Compile and load the program (host tracepoints attach automatically).

    Calls in flight live in task-local storage where the kernel allows it (BTF, 5.11+),
    else in a hash map: same results, about 250 ns more per call. Libraries attach through
    uprobe_multi links where the kernel has them (6.6+) and ``uprobe_multi`` is left on,
    else as BCC's perf-event uprobes: same probes, a slower stop. Launches
    (``launch_returns``, facilities.py): ``sampled`` where the kernel has uprobe sessions
    (6.13+; ``auto`` picks it there), counted at entry with about ``launch_timed_per_s``
    a second timed; ``all``: every launch takes its return probe, as every other op does.
    ``facilities``: the kernel's, probed here when not given. ``launch_reads`` off (a
    benchmark's diagnosis: what reading the stream and the return address costs) reads
    neither, so launches name no stream and the runtime's own driver launches count again.
    """
    bcc = load_bcc()
    if launch_returns != LAUNCH_ALL and facilities is None:
        facilities = probe_facilities()
    source = bpf_source_path().read_text()
    variants = [["-DUSE_TASK_STORAGE"], []] if task_storage else [[]]
    error: Exception | None = None
    for flags in variants:
        mode, why = LAUNCH_ALL, "asked for (--launch-returns all): every launch is timed"
        if facilities is not None:
            try:
                mode, why = facilities.launch_mode(launch_returns, bool(flags), uprobe_multi)
            except ValueError as exc:
                error = exc
                continue
        kfuncs = facilities.kfuncs if facilities is not None and mode == LAUNCH_SAMPLED else None
        text = program_text(source, sample_every, stacks, stack_slow_ms, kfuncs is not None,
                            launch_timed_per_s, launch_reads,
                            kfuncs.trampoline if kfuncs else ())  # fmt: skip
        try:
            bpf = bcc.BPF(text=text.encode(), cflags=["-Wno-macro-redefined", *flags])
        except Exception as exc:  # compile/verifier errors arrive as bare Exception
            error = exc
            continue
        if stacks:
            try:
                tailcall.link_sampler(bpf)
            except Exception as exc:  # BCC raises bare Exception when a program cannot load
                bpf.cleanup()
                error = exc
                continue
        return Probes(
            bpf, pid, task_storage=bool(flags), multi=uprobe_multi, stacks=stacks,
            launch_mode=mode, launch_why=why, kfuncs=kfuncs,
        )  # fmt: skip
    if isinstance(error, ValueError):  # the launch mode asked for cannot run here
        raise ProbeError(str(error))
    raise ProbeError(f"cannot load the BPF program: {error}")
