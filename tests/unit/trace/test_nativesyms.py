"""Native frames named from /proc/PID/maps and the mapped file's ELF symbols."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
import sys
from pathlib import Path

from ingero.trace.nativesyms import REREAD_S, NativeSymbols, load_symbols, read_maps


def _addr(fn: object) -> int:
    value = ctypes.cast(fn, ctypes.c_void_p).value
    assert value is not None
    return value


def test_a_libc_function_and_an_offset_into_it() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    syms = NativeSymbols()
    name, off, lib = syms.resolve(os.getpid(), _addr(libc.getpid))
    assert name is not None and "getpid" in name and off == 0
    assert lib is not None and "libc" in Path(lib).name
    name2, off2, _ = syms.resolve(os.getpid(), _addr(libc.getpid) + 3)
    assert (name2, off2) == (name, 3)


def test_a_library_loaded_after_the_first_read_is_named(tmp_path: Path) -> None:
    src = tmp_path / "late.c"
    src.write_text("int ingero_late_fn(int x) { return x * 3 + 1; }\n")
    so = tmp_path / "liblate.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    now = [100.0]
    syms = NativeSymbols(clock=lambda: now[0])
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    syms.resolve(os.getpid(), _addr(libc.getpid))  # maps read and cached before the dlopen
    late = ctypes.CDLL(str(so))
    # Within REREAD_S of the last read a miss does not read the maps again (a frame-pointer
    # walk through code without them misses on every call) ...
    now[0] += REREAD_S / 2
    assert syms.resolve(os.getpid(), _addr(late.ingero_late_fn) + 1) == (None, None, None)
    # ... after it, the first miss does, and finds the library.
    now[0] += REREAD_S
    name, off, lib = syms.resolve(os.getpid(), _addr(late.ingero_late_fn) + 1)
    assert (name, off, lib) == ("ingero_late_fn", 1, str(so))


def test_unknown_addresses_and_gone_processes_name_nothing() -> None:
    syms = NativeSymbols()
    assert syms.resolve(os.getpid(), 8) == (None, None, None)
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert syms.resolve(p.pid, 0x400000) == (None, None, None)


def test_maps_list_executable_file_mappings_only() -> None:
    maps = read_maps(os.getpid())
    assert maps and all(m.path.startswith("/") and m.start < m.end for m in maps)
    table = load_symbols(maps[0].path)
    assert (table.starts[1:] > table.starts[:-1]).all()  # sorted, one entry per address
    table.close()


def test_the_array_read_of_the_symbol_tables_matches_pyelftools_per_symbol_read() -> None:
    """load_symbols reads .symtab/.dynsym as arrays (pyelftools' per-symbol objects took tens
    of seconds for libtorch on a real GPU node); every libc function reads as pyelftools
    names it, the first name of an address winning."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    path = next(m.path for m in read_maps(os.getpid()) if "/libc.so" in m.path)
    table = load_symbols(path)
    ref: dict[int, tuple[int, str]] = {}
    with open(path, "rb") as f:
        elf = ELFFile(f)
        for name in (".symtab", ".dynsym"):
            sec = elf.get_section_by_name(name)
            if not isinstance(sec, SymbolTableSection):
                continue
            for sym in sec.iter_symbols():
                if sym["st_info"]["type"] == "STT_FUNC" and sym["st_value"] and sym.name:
                    ref.setdefault(sym["st_value"], (max(sym["st_size"], 1), sym.name))
    assert len(table) == len(ref) > 1000
    for addr, (size, name) in ref.items():
        assert table.lookup(addr + size - 1) == (name, size - 1)
    table.close()
