"""Turn a sample's raw stack (return addresses, CPython frame pairs) into a ``Stack``.

Native frames are symbolised by the loaded program's symbol cache (BCC), Python frames by
``pyframes`` (one reader per process, code objects cached by address). They interleave as
the call happened: the native frames inner to the interpreter (the op's caller, ctypes,
libffi…), then the Python frames; the interpreter's own frames outside them are left out.
The reader also keeps the program's view of each CPython process current (its layout and
its threads' states), so the kernel side can walk frames.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ingero.schema.stacks import MAX_FRAMES, Frame, Stack
from ingero.trace.decode import PY_FAULT, PY_NO_THREAD, PY_TRUNCATED, TraceEvent
from ingero.trace.pyframes.layout import Layout
from ingero.trace.pyframes.memory import ReadError
from ingero.trace.pyframes.reader import PyProcess, Walk, open_or_reason

MAX_CACHE = 65536
_PY_REASONS = {
    PY_TRUNCATED: "python frames truncated",
    PY_FAULT: "python frames unreadable (thread moved on)",
    PY_NO_THREAD: "python thread not mapped yet",
}


class PythonProbes(Protocol):
    def set_python(
        self,
        pid: int,
        layout: Layout,
        tstates: dict[int, int],
        interp: int = 0,
        pthread_tid: int | None = None,
    ) -> None: ...
    def forget_python(self, pid: int, tids: set[int]) -> None: ...
    def symbol(self, pid: int, addr: int) -> tuple[str | None, int | None, str | None]: ...


@dataclass
class StackResolver:
    probes: PythonProbes
    proc: Path = Path("/proc")
    _python: dict[int, PyProcess | str] = field(default_factory=dict)
    _tids: dict[int, set[int]] = field(default_factory=dict)
    _stale: set[int] = field(default_factory=set)
    _cache: dict[tuple[object, ...], Stack] = field(default_factory=dict)

    def register(self, pids: list[int]) -> None:
        """New processes: CPython ones get their layout and threads into the program."""
        for pid in pids:
            if pid not in self._python:
                self._python[pid] = open_or_reason(pid, self.proc)
                self._stale.add(pid)
        self.refresh()

    def refresh(self, everyone: bool = False) -> None:
        """Re-read the thread lists of the CPython processes that need it (new threads)."""
        pids = [p for p, r in self._python.items() if isinstance(r, PyProcess)]
        for pid in pids if everyone else sorted(self._stale & set(pids)):
            reader = self._python[pid]
            assert isinstance(reader, PyProcess)
            try:
                threads = reader.threads()
                interp = reader.main_interpreter()
            except ReadError:
                continue
            gone = self._tids.get(pid, set()) - set(threads)
            if gone:
                self.probes.forget_python(-1, gone)
            self._tids[pid] = set(threads)
            self.probes.set_python(pid, reader.layout, threads, interp, reader.pthread_tid)
        self._stale.clear()

    def forget(self, pids: set[int]) -> None:
        for pid in pids:
            if isinstance(self._python.pop(pid, None), PyProcess):
                self.probes.forget_python(pid, self._tids.pop(pid, set()))
        if len(self._cache) > MAX_CACHE:
            self._cache.clear()

    def _native(self, pid: int, addr: int) -> Frame:
        try:
            name, offset, lib = self.probes.symbol(pid, addr)
        except Exception:  # a process gone before its symbols were read
            name = offset = lib = None
        return Frame(kind="native", function=name, lib=lib, addr=addr, offset=offset)

    def resolve(self, ev: TraceEvent) -> Stack | None:
        """The sample's stack, or None when it carries none."""
        if ev.native is None:
            return None
        tids = self._tids.get(ev.pid)
        if ev.py and tids is not None:
            # A thread the program looked up itself in the interpreter's list (started
            # since the last refresh): known here, so its exit forgets its map entry.
            tids.add(ev.tid)
        key = (ev.pid, ev.native, ev.py, ev.py_state)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        reader = self._python.get(ev.pid)
        if ev.py_state == PY_NO_THREAD:
            self._stale.add(ev.pid)
        native = [self._native(ev.pid, a) for a in ev.native]
        reason = _PY_REASONS.get(ev.py_state)
        if isinstance(reader, PyProcess):
            image = os.path.realpath(reader.image.path)
            inner: list[Frame] = []
            for f in native:
                if f.lib and os.path.realpath(f.lib) == image:
                    break
                inner.append(f)
            # Code 0: a C-stack shim frame (3.12+) the program marked; no line of the job.
            py = reader.symbolize(Walk(tuple(f for f in ev.py if f[0])))
            frames = [*inner, *py.frames] if ev.py else native
            reason = reason or py.reason
        else:
            frames = native
            if isinstance(reader, str) and reader != "not a CPython process":
                reason = f"{reader}: native frames only"
        stack = Stack(tuple(frames[:MAX_FRAMES]), reason)
        self._cache[key] = stack
        return stack
