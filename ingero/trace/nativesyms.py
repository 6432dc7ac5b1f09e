"""Name native frames: a user address of a process → (function, offset, mapped file).

The process's mappings come from ``/proc/PID/maps`` (read again when an address falls
outside every known mapping: a library dlopen()ed after the first read, as ctypes and
PyTorch's lazy CUDA loading do; at most every ``REREAD_S`` per process, since a frame-pointer
walk through code built without them yields addresses no mapping holds, and a real PyTorch
process's maps cost milliseconds to read), the function from the mapped file's ELF symbol tables
(``.symtab`` where not stripped, else ``.dynsym``) through pyelftools, read once per file,
demangled by libstdc++ (``ingero.trace.demangle``).
BCC's own symbol cache was tried first: it read the maps once per process and named
nothing dlopen()ed later, which is every CUDA library of a Python job.
"""

from __future__ import annotations

import bisect
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from ingero.trace.demangle import demangle
from ingero.trace.procmaps import DEFAULT_PROC

# Bounds: files whose symbols are kept, processes whose maps are kept.
MAX_FILES = 64
MAX_PROCS = 256
# A miss reads a process's maps again at most this often (seconds).
REREAD_S = 1.0


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    offset: int  # file offset of start
    path: str


@dataclass(frozen=True)
class SymbolTable:
    starts: list[int]  # sorted function start addresses (file virtual addresses)
    ends: list[int]
    names: list[str]
    segments: list[tuple[int, int, int]]  # PT_LOAD (p_offset, p_filesz, p_vaddr)

    def vaddr_of(self, file_offset: int) -> int | None:
        """The file's virtual address of a file offset (what its symbols hold)."""
        for off, size, vaddr in self.segments:
            if off <= file_offset < off + size:
                return file_offset - off + vaddr
        return None

    def lookup(self, vaddr: int) -> tuple[str, int] | None:
        i = bisect.bisect_right(self.starts, vaddr) - 1
        if i < 0 or vaddr >= self.ends[i]:
            return None
        return self.names[i], vaddr - self.starts[i]


def read_maps(pid: int, proc: Path = DEFAULT_PROC, executable: bool = True) -> list[Mapping]:
    """The file mappings of ``pid`` (only the executable ones unless told otherwise)."""
    out: list[Mapping] = []
    with open(proc / str(pid) / "maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if (
                len(parts) < 6
                or not parts[5].startswith("/")
                or (executable and "x" not in parts[1])
            ):
                continue
            lo, hi = parts[0].split("-", 1)
            out.append(Mapping(int(lo, 16), int(hi, 16), int(parts[2], 16), parts[5].rstrip()))
    return out


def load_symbols(path: str) -> SymbolTable:
    """Function symbols of an ELF file; raises OSError or ELFError."""
    with open(path, "rb") as f:
        elf = ELFFile(f)
        segments = [
            (int(s["p_offset"]), int(s["p_filesz"]), int(s["p_vaddr"]))
            for s in elf.iter_segments()
            if s["p_type"] == "PT_LOAD"
        ]
        funcs: dict[int, tuple[int, str]] = {}
        for name in (".symtab", ".dynsym"):
            sec = elf.get_section_by_name(name)
            if not isinstance(sec, SymbolTableSection):
                continue
            for sym in sec.iter_symbols():
                if sym["st_info"]["type"] != "STT_FUNC" or not sym["st_value"] or not sym.name:
                    continue
                size = max(int(sym["st_size"]), 1)
                funcs.setdefault(int(sym["st_value"]), (size, sym.name))
    starts = sorted(funcs)
    return SymbolTable(
        starts=starts,
        ends=[s + funcs[s][0] for s in starts],
        names=[funcs[s][1] for s in starts],
        segments=segments,
    )


@dataclass(frozen=True)
class _Maps:
    read_at: float  # monotonic seconds
    starts: list[int]  # sorted
    maps: list[Mapping]  # in the order of starts

    def containing(self, addr: int) -> Mapping | None:
        i = bisect.bisect_right(self.starts, addr) - 1
        if i >= 0 and addr < self.maps[i].end:
            return self.maps[i]
        return None


class NativeSymbols:
    """Bounded caches of process maps and file symbol tables."""

    def __init__(
        self, proc: Path = DEFAULT_PROC, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.proc = proc
        self.clock = clock
        self._maps: OrderedDict[int, _Maps] = OrderedDict()
        self._files: OrderedDict[str, SymbolTable | None] = OrderedDict()

    def forget(self, pid: int) -> None:
        self._maps.pop(pid, None)

    def _mapping(self, pid: int, addr: int) -> Mapping | None:
        known = self._maps.get(pid)
        if known is not None:
            hit = known.containing(addr)
            if hit is not None or self.clock() - known.read_at < REREAD_S:
                return hit
        # Maps not read yet, or a library mapped since they were.
        try:
            maps = sorted(read_maps(pid, self.proc), key=lambda m: m.start)
        except OSError:
            return None
        known = _Maps(self.clock(), [m.start for m in maps], maps)
        self._maps[pid] = known
        self._maps.move_to_end(pid)
        while len(self._maps) > MAX_PROCS:
            self._maps.popitem(last=False)
        return known.containing(addr)

    def _table(self, pid: int, path: str) -> SymbolTable | None:
        if path not in self._files:
            try:
                # Through the process's root, so a container's libraries are read.
                table: SymbolTable | None = load_symbols(str(self.proc / str(pid) / "root") + path)
            except (OSError, ELFError, ValueError):
                table = None
            self._files[path] = table
            while len(self._files) > MAX_FILES:
                self._files.popitem(last=False)
        return self._files[path]

    def resolve(self, pid: int, addr: int) -> tuple[str | None, int | None, str | None]:
        """(function, offset in it, mapped file) of ``addr`` in ``pid``; None where unknown."""
        m = self._mapping(pid, addr)
        if m is None:
            return None, None, None
        table = self._table(pid, m.path)
        if table is None:
            return None, None, m.path
        vaddr = table.vaddr_of(addr - m.start + m.offset)
        hit = None if vaddr is None else table.lookup(vaddr)
        if hit is None:
            return None, None, m.path
        return demangle(hit[0]), hit[1], m.path
