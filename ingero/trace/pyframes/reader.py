"""Walk a live CPython process's threads and frames from outside it.

``PyProcess.open(pid)`` finds the runtime (elf.py), the version and its layout
(layout.py). Threads come from the interpreter's own list (``_PyRuntime.interpreters.head``
→ ``threads.head`` → ``next``), each keyed by its kernel thread id (``native_thread_id``;
3.10 has none, so the tid is read out of glibc's ``struct pthread``, at the offset where
the main thread's own tid sits). A frame is a (code object address, instruction) pair;
code objects are symbolised once per address (cache), with the line from the line table
at the frame's instruction offset, never ``co_firstlineno``.

Nothing here raises for a bad target: an exited process, unreadable memory or a chain
longer than the cap ends the walk with what was read and a reason.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from ingero.schema.stacks import MAX_FRAMES, MAX_TEXT, Frame, Stack
from ingero.trace.pyframes.elf import PythonImage, find_python
from ingero.trace.pyframes.layout import (
    DEBUG_OFFSETS_SIZE,
    Layout,
    UnsupportedPython,
    from_debug_offsets,
    table_for,
    version_of_hex,
)
from ingero.trace.pyframes.linetable import line_for
from ingero.trace.pyframes.memory import Memory, ReadError

MAX_THREADS = 65536  # a cycle guard on the interpreter's thread list, not a scan bound
MAX_INTERPRETERS = 64
MAX_CODE_CACHE = 65536
MAX_LINETABLE = 1 << 20
GLIBC_TID_OFFSET = 0x2D0  # struct pthread's tid on x86-64 glibc 2.x: the first guess
PTHREAD_SEARCH = 0x800


@dataclass(frozen=True)
class CodeInfo:
    filename: str | None
    name: str | None
    firstlineno: int
    linetable: bytes


@dataclass(frozen=True)
class Walk:
    """One thread's Python frames, innermost first, as (code address, instruction)."""

    frames: tuple[tuple[int, int], ...]
    reason: str | None = None


@dataclass
class PyProcess:
    pid: int
    image: PythonImage
    layout: Layout
    mem: Memory
    runtime: int
    _codes: dict[int, CodeInfo | None] = field(default_factory=dict)
    _tid_offset: int | None = None

    @classmethod
    def open(cls, pid: int, proc: Path = Path("/proc")) -> PyProcess:
        """Raises UnsupportedPython (not CPython, free-threaded, unknown version) or
        ReadError (exited, unreadable)."""
        try:
            image = find_python(pid, proc)
        except OSError as exc:
            raise ReadError(f"pid {pid}: {exc}") from None
        if image is None:
            raise UnsupportedPython("not a CPython process")
        if image.free_threaded:
            raise UnsupportedPython("free-threaded CPython build (Py_GIL_DISABLED) not supported")
        mem = Memory(pid)
        runtime = image.symbols["_PyRuntime"]
        version = image.version
        if "Py_Version" in image.symbols:
            version = version_of_hex(
                struct.unpack("<I", mem.read(image.symbols["Py_Version"], 4))[0]
            )
        if version >= (3, 13):
            layout = from_debug_offsets(mem.read(runtime, DEBUG_OFFSETS_SIZE))
        else:
            layout = table_for(version)
        layout.window()  # the BPF walk reads a frame in one go
        return cls(pid, image, layout, mem, runtime)

    # Threads -----------------------------------------------------------------------------

    def _tstates(self) -> list[int]:
        L, out = self.layout, []
        interp = self.mem.u64(self.runtime + L.runtime_interpreters_head)
        seen: set[int] = set()
        for _ in range(MAX_INTERPRETERS):
            if not interp:
                break
            t = self.mem.u64(interp + L.interp_threads_head)
            while t and t not in seen and len(seen) < MAX_THREADS:
                seen.add(t)
                out.append(t)
                t = self.mem.u64(t + L.tstate_next)
            interp = self.mem.u64(interp)  # PyInterpreterState.next is its first field
        return out

    def main_interpreter(self) -> int:
        """The main interpreter's state (the last of the list: the first one made), or 0."""
        interp = self.mem.u64(self.runtime + self.layout.runtime_interpreters_head)
        for _ in range(MAX_INTERPRETERS):
            nxt = self.mem.u64(interp) if interp else 0
            if not nxt:
                return interp
            interp = nxt
        return 0

    @property
    def pthread_tid(self) -> int | None:
        """3.10: where glibc's struct pthread keeps the tid (found by :meth:`threads`), for
        the tracer's own lookup of a thread born since; None on 3.11+ or not found."""
        return self._tid_offset if self.layout.tstate_native_thread_id is None else None

    def _pthread_tid(self, pthread: int) -> int:
        if self._tid_offset is None:
            raise ReadError("tid offset in struct pthread unknown")
        return int(struct.unpack("<i", self.mem.read(pthread + self._tid_offset, 4))[0])

    def _calibrate_tid_offset(self, pthreads: list[int]) -> None:
        """3.10: find where glibc's struct pthread keeps the tid, from the main thread
        (its tid is the pid). The usual offset is checked first."""
        want = struct.pack("<i", self.pid)
        for p in pthreads:
            try:
                if self.mem.read(p + GLIBC_TID_OFFSET, 4) == want:
                    self._tid_offset = GLIBC_TID_OFFSET
                    return
            except ReadError:
                continue
        for p in pthreads:
            try:
                block = self.mem.read(p, PTHREAD_SEARCH)
            except ReadError:
                continue
            for off in range(0, PTHREAD_SEARCH, 4):
                if block[off : off + 4] == want:
                    self._tid_offset = off
                    return

    def threads(self) -> dict[int, int]:
        """Kernel tid → PyThreadState address, from the interpreter's own thread list."""
        L = self.layout
        out: dict[int, int] = {}
        tstates = self._tstates()
        if L.tstate_native_thread_id is not None:
            for t in tstates:
                tid = struct.unpack("<q", self.mem.read(t + L.tstate_native_thread_id, 8))[0]
                if tid > 0:
                    out[int(tid)] = t
            return out
        pthreads = {t: self.mem.u64(t + L.tstate_thread_id) for t in tstates}
        if self._tid_offset is None:
            self._calibrate_tid_offset([p for p in pthreads.values() if p])
        for t, p in pthreads.items():
            if p:
                tid = self._pthread_tid(p)
                if tid > 0:
                    out[tid] = t
        return out

    # Frames -------------------------------------------------------------------------------

    def current_frame(self, tstate: int) -> int:
        L = self.layout
        ptr = self.mem.u64(tstate + L.tstate_frame)
        if L.cframe_current_frame is not None and ptr:
            ptr = self.mem.u64(ptr + L.cframe_current_frame)
        return ptr

    def walk(self, tstate: int, max_frames: int = MAX_FRAMES) -> Walk:
        """The thread's frame chain; a short chain and a reason when it cannot be read."""
        L = self.layout
        frames: list[tuple[int, int]] = []
        size = max(L.frame_previous, L.frame_code, L.frame_instr, L.frame_owner or 0) + 8
        try:
            f = self.current_frame(tstate)
            seen: set[int] = set()
            while f:
                if f in seen:
                    return Walk(tuple(frames), "frame chain loops")
                if len(frames) >= max_frames:
                    return Walk(tuple(frames), f"truncated at {max_frames} frames")
                seen.add(f)
                raw = self.mem.read(f, size)
                code = struct.unpack_from("<Q", raw, L.frame_code)[0]
                if L.lasti_index:
                    instr = struct.unpack_from("<i", raw, L.frame_instr)[0]
                else:
                    instr = struct.unpack_from("<Q", raw, L.frame_instr)[0]
                owner = raw[L.frame_owner] if L.frame_owner is not None else None
                if not (L.shim_owner is not None and owner == L.shim_owner):
                    frames.append((code, instr))
                f = struct.unpack_from("<Q", raw, L.frame_previous)[0]
        except ReadError:
            reason = (
                "process exited mid-walk" if not self.mem.alive() else "unreadable frame memory"
            )
            return Walk(tuple(frames), reason)
        return Walk(tuple(frames))

    # Code objects -------------------------------------------------------------------------

    def _text(self, addr: int) -> str | None:
        L = self.layout
        if not addr:
            return None
        head = self.mem.read(addr, L.unicode_state + 4)
        length = struct.unpack_from("<q", head, L.unicode_length)[0]
        state = struct.unpack_from("<I", head, L.unicode_state)[0]
        kind, compact, ascii_ = (state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1
        if not compact or kind not in (1, 2, 4) or length < 0:
            return None
        n = min(length, MAX_TEXT)
        data = self.mem.read(addr + (L.ascii_size if ascii_ else L.compact_size), max(1, n * kind))
        codec = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind]
        return data[: n * kind].decode(codec, errors="replace") if n else ""

    def code(self, addr: int) -> CodeInfo | None:
        """The code object at ``addr`` (cached per address), or None when unreadable."""
        if addr in self._codes:
            return self._codes[addr]
        L = self.layout
        info: CodeInfo | None = None
        try:
            code_type = self.image.symbols.get("PyCode_Type")
            if code_type is not None and self.mem.u64(addr + 8) != code_type:
                raise ReadError("not a code object")
            filename = self._text(self.mem.u64(addr + L.code_filename))
            name = self._text(self.mem.u64(addr + L.code_name))
            first = struct.unpack("<i", self.mem.read(addr + L.code_firstlineno, 4))[0]
            table_addr = self.mem.u64(addr + L.code_linetable)
            n = self.mem.u64(table_addr + L.bytes_size)
            if n > MAX_LINETABLE:
                raise ReadError("line table too long")
            table = self.mem.read(table_addr + L.bytes_sval, n) if n else b""
            info = CodeInfo(filename, name, int(first), table)
        except ReadError:
            info = None
        if len(self._codes) >= MAX_CODE_CACHE:
            self._codes.clear()
        self._codes[addr] = info
        return info

    def offset_of(self, code: int, instr: int) -> int:
        """Byte offset into the bytecode of the frame's current instruction."""
        L = self.layout
        if L.lasti_index:
            return instr * 2 if instr >= 0 else -1
        assert L.code_adaptive is not None
        return instr - (code + L.code_adaptive)

    def frame(self, code: int, instr: int) -> Frame | None:
        code &= ~self.layout.code_tag_bits  # 3.14: a tagged _PyStackRef (BPF frames too)
        info = self.code(code)
        if info is None:
            return None
        line = line_for(
            info.linetable, info.firstlineno, self.offset_of(code, instr), self.layout.linetable
        )
        return Frame(kind="py", function=info.name, file=info.filename, line=line)

    def symbolize(self, walk: Walk) -> Stack:
        frames: list[Frame] = []
        reason = walk.reason
        for code, instr in walk.frames:
            f = self.frame(code, instr)
            if f is None:
                reason = reason or "unreadable code object"
                continue
            frames.append(f)
        return Stack(tuple(frames), reason)

    def stacks(self) -> dict[int, Stack]:
        """Every Python thread's stack now, by kernel tid (a snapshot, not atomic)."""
        out: dict[int, Stack] = {}
        try:
            threads = self.threads()
        except ReadError:
            return out
        for tid, tstate in threads.items():
            out[tid] = self.symbolize(self.walk(tstate))
        return out


def open_or_reason(pid: int, proc: Path = Path("/proc")) -> PyProcess | str:
    """The process's reader, or why its Python frames cannot be read."""
    try:
        return PyProcess.open(pid, proc)
    except UnsupportedPython as exc:
        return str(exc)
    except ReadError as exc:
        return (
            f"unreadable process memory: {exc}"
            if os.path.exists(proc / str(pid))
            else "process exited"
        )
