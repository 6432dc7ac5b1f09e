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
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from ingero.trace.demangle import demangle
from ingero.trace.procmaps import DEFAULT_PROC

# Bounds: files whose symbols are kept, processes whose maps are kept.
MAX_FILES = 64
MAX_PROCS = 256
# A function name longer than this is cut (the stacks schema keeps 512 characters).
MAX_NAME = 4096
# Names kept per file (the hot stacks of a job name a few hundred functions).
MAX_NAMES = 4096
# A miss reads a process's maps again at most this often (seconds).
REREAD_S = 1.0


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    offset: int  # file offset of start
    path: str


# One ELF64 symbol (Elf64_Sym), little-endian: what .symtab and .dynsym hold.
_SYM64 = np.dtype(
    [("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"), ("value", "<u8"),
     ("size", "<u8")]
)  # fmt: skip
_STT_FUNC = 2
_NAME_CHUNK = 256  # bytes read at a time for a symbol's name (C++ names run long)


@dataclass(frozen=True)
class SymbolTable:
    """A file's function symbols, sorted by start address. Names stay in the file: a
    PyTorch library names ~10^5-10^6 functions in tens of MB of strings, and a stack needs a
    handful, so a name is read from the string table (through ``fd``, open while the table
    is kept, so the file outlives the process it was found through) when a lookup hits it."""

    fd: int  # the file, open read-only (-1: no symbols, nothing to read)
    starts: npt.NDArray[np.uint64]  # file virtual addresses, sorted
    sizes: npt.NDArray[np.uint64]  # at least 1
    name_at: npt.NDArray[np.uint64]  # file offset of each name (string table + st_name)
    segments: list[tuple[int, int, int]]  # PT_LOAD (p_offset, p_filesz, p_vaddr)
    _names: dict[int, str | None] = field(default_factory=dict, compare=False)

    def vaddr_of(self, file_offset: int) -> int | None:
        """The file's virtual address of a file offset (what its symbols hold)."""
        for off, size, vaddr in self.segments:
            if off <= file_offset < off + size:
                return file_offset - off + vaddr
        return None

    def lookup(self, vaddr: int) -> tuple[str, int] | None:
        i = int(np.searchsorted(self.starts, np.uint64(vaddr), side="right")) - 1
        if i < 0 or vaddr >= int(self.starts[i]) + int(self.sizes[i]):
            return None
        if i not in self._names:
            if len(self._names) >= MAX_NAMES:
                self._names.clear()
            self._names[i] = self._read_name(int(self.name_at[i]))
        name = self._names[i]
        return (name, vaddr - int(self.starts[i])) if name else None

    def _read_name(self, at: int) -> str | None:
        """The NUL-ended string at file offset ``at`` (None: unreadable)."""
        raw = b""
        try:
            while b"\0" not in raw and len(raw) < MAX_NAME:
                chunk = os.pread(self.fd, _NAME_CHUNK, at + len(raw))
                if not chunk:
                    break
                raw += chunk
        except OSError:
            return None
        return raw.split(b"\0", 1)[0][:MAX_NAME].decode("utf-8", "replace") or None

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)

    def __len__(self) -> int:
        return len(self.starts)


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
    """Function symbols of an ELF file (``.symtab`` first, then ``.dynsym``; the first name
    of an address wins); raises OSError, ELFError or ValueError. The tables are read as
    arrays: pyelftools' per-symbol objects took ~40 µs each, tens of seconds for libtorch,
    inside the tracer's read of its samples."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _read_table(fd, path)
    except BaseException:
        os.close(fd)
        raise


def _read_table(fd: int, path: str) -> SymbolTable:
    with open(os.dup(fd), "rb") as f:
        elf = ELFFile(f)
        segments = [
            (int(s["p_offset"]), int(s["p_filesz"]), int(s["p_vaddr"]))
            for s in elf.iter_segments()
            if s["p_type"] == "PT_LOAD"
        ]
        if elf.elfclass != 64 or not elf.little_endian:
            raise ValueError(f"{path}: not a little-endian ELF64 file")
        values, sizes, names = [], [], []
        for section in (".symtab", ".dynsym"):
            sec = elf.get_section_by_name(section)
            if not isinstance(sec, SymbolTableSection) or sec["sh_entsize"] != _SYM64.itemsize:
                continue
            strtab = elf.get_section(sec["sh_link"])
            f.seek(sec["sh_offset"])
            raw = f.read(sec["sh_size"] - sec["sh_size"] % _SYM64.itemsize)
            syms = np.frombuffer(raw, dtype=_SYM64)
            keep = ((syms["info"] & 0xF) == _STT_FUNC) & (syms["value"] != 0) & (syms["name"] != 0)
            keep &= syms["name"] < strtab["sh_size"]
            syms = syms[keep]
            values.append(syms["value"])
            sizes.append(np.maximum(syms["size"], 1))
            names.append(syms["name"].astype(np.uint64) + np.uint64(strtab["sh_offset"]))
    if not values:
        empty = np.zeros(0, dtype=np.uint64)
        return SymbolTable(fd, empty, empty, empty, segments)
    all_values = np.concatenate(values)
    # np.unique keeps each address's first index: .symtab's name over .dynsym's.
    starts, first = np.unique(all_values, return_index=True)
    return SymbolTable(
        fd=fd,
        starts=starts,
        sizes=np.concatenate(sizes)[first],
        name_at=np.concatenate(names)[first],
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
                _, old = self._files.popitem(last=False)
                if old is not None:
                    old.close()
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
