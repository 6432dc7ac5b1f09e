"""Find the CPython runtime in a process: which mapped file holds ``_PyRuntime``, where.

The symbols come from the file's ELF symbol tables through pyelftools (CPython exports
``_PyRuntime``, ``Py_Version`` and ``PyCode_Type`` in its dynamic symbol table, both in
``libpython3.X.so`` and in a statically linked ``python3.X``). The load bias is the start
of the file's first mapping less the first loadable segment's address.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from ingero.trace.nativesyms import read_maps

# python3.11, python3.13t, libpython3.10.so.1.0, libpython3.13t.so.1.0
_NAME = re.compile(r"^(?:lib)?python(\d)\.(\d+)(t?)(?:d|m)?(?:\.so.*)?$")
WANTED = ("_PyRuntime", "Py_Version", "PyCode_Type")


@dataclass(frozen=True)
class PythonImage:
    path: str
    version: tuple[int, int]  # from the file name
    free_threaded: bool  # a "t" build (Py_GIL_DISABLED)
    symbols: dict[str, int]  # absolute addresses in the process


def _mappings(pid: int, proc: Path) -> dict[str, list[tuple[int, int]]]:
    """path → [(start, file offset)] of its mappings."""
    out: dict[str, list[tuple[int, int]]] = {}
    for m in read_maps(pid, proc, executable=False):
        out.setdefault(m.path, []).append((m.start, m.offset))
    return out


def _symbols(path: str, proc_root: str) -> tuple[dict[str, int], int, bool]:
    """Wanted symbol values, the first PT_LOAD vaddr, and whether the file is PIE/shared."""
    found: dict[str, int] = {}
    with open(proc_root + path if proc_root else path, "rb") as f:
        elf = ELFFile(f)
        loads = [
            s["p_vaddr"] - s["p_offset"] for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"
        ]
        for name in (".dynsym", ".symtab"):
            sec = elf.get_section_by_name(name)
            if not isinstance(sec, SymbolTableSection):
                continue
            for want in WANTED:
                if want in found:
                    continue
                syms = sec.get_symbol_by_name(want)
                if syms and syms[0]["st_value"]:
                    found[want] = syms[0]["st_value"]
        return found, min(loads) if loads else 0, elf["e_type"] == "ET_DYN"


def find_python(pid: int, proc: Path = Path("/proc")) -> PythonImage | None:
    """The CPython image of ``pid`` (libpython when mapped, else the executable), or None
    when no mapped file is a CPython with ``_PyRuntime``."""
    maps = _mappings(pid, proc)
    candidates = sorted(
        (p for p in maps if _NAME.match(os.path.basename(p))),
        key=lambda p: not os.path.basename(p).startswith("lib"),
    )
    # The file is read through the process's root, so a container's python is found.
    root = str(proc / str(pid) / "root")
    for path in candidates:
        m = _NAME.match(os.path.basename(path))
        assert m is not None
        try:
            syms, first_vaddr, dyn = _symbols(path, root)
        except (OSError, ELFError, ValueError):
            continue
        if "_PyRuntime" not in syms:
            continue
        base = min(start - off for start, off in maps[path]) if dyn else 0
        bias = base - first_vaddr if dyn else 0
        return PythonImage(
            path=path,
            version=(int(m.group(1)), int(m.group(2))),
            free_threaded=m.group(3) == "t",
            symbols={k: v + bias for k, v in syms.items()},
        )
    return None
