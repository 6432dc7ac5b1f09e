"""Find the CUDA/NCCL libraries processes map, from /proc/PID/maps.

Paths in a container's maps are relative to its root, so each is resolved through
/proc/PID/root. The proc root is injectable so tests run on fixture trees.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ingero.trace.ops import LIB_STEMS

DEFAULT_PROC = Path("/proc")
# "<range> <perms> <offset> <dev> <inode> <path>"; the path may contain spaces.
_MAPS_LINE = re.compile(r"^\S+\s+\S+\s+\S+\s+\S+\s+(\d+)\s+(/.*)$")


@dataclass(frozen=True)
class LibraryFile:
    """A library as the host sees it: the path to attach to and its (dev, inode) identity."""

    kind: str  # cudart | cuda | nccl
    path: str
    dev: int
    inode: int


@dataclass
class ProcessLibs:
    pid: int
    libs: dict[str, LibraryFile] = field(default_factory=dict)


def lib_kind(path: str) -> str | None:
    """Which traced library a mapped path is (``libcudart.so.13`` → cudart), if any."""
    name = os.path.basename(path.removesuffix(" (deleted)"))
    for kind, stem in LIB_STEMS.items():
        if name == stem or name.startswith(stem + "."):
            return kind
    return None


def parse_maps(text: str) -> dict[str, str]:
    """Traced libraries in one maps file: kind → path as the process sees it."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        m = _MAPS_LINE.match(line)
        if m is None or m.group(1) == "0":
            continue
        path = m.group(2)
        kind = lib_kind(path)
        if kind is not None and kind not in found:
            found[kind] = path
    return found


def iter_pids(proc: Path = DEFAULT_PROC) -> Iterator[int]:
    try:
        names = os.listdir(proc)
    except OSError:
        return
    for name in names:
        if name.isdigit():
            yield int(name)


def host_path(pid: int, path: str, proc: Path = DEFAULT_PROC) -> Path:
    """The host path of ``path`` inside PID's mount namespace (containers included)."""
    return proc / str(pid) / "root" / path.lstrip("/")


def scan_process(pid: int, proc: Path = DEFAULT_PROC) -> ProcessLibs | None:
    """Libraries PID maps, or None when it has none or vanished meanwhile."""
    try:
        text = (proc / str(pid) / "maps").read_text(errors="replace")
    except OSError:
        return None
    found = parse_maps(text)
    if not found:
        return None
    result = ProcessLibs(pid)
    for kind, path in found.items():
        resolved = host_path(pid, path, proc)
        try:
            st = resolved.stat()
        except OSError:
            continue
        result.libs[kind] = LibraryFile(kind, str(resolved), st.st_dev, st.st_ino)
    return result if result.libs else None


def scan(pids: Iterable[int] | None = None, proc: Path = DEFAULT_PROC) -> list[ProcessLibs]:
    """Every process (or the given ones) that maps a traced library."""
    out = []
    for pid in iter_pids(proc) if pids is None else pids:
        found = scan_process(pid, proc)
        if found is not None:
            out.append(found)
    return out


def unique_libraries(procs: Iterable[ProcessLibs]) -> list[LibraryFile]:
    """One entry per library file (by dev+inode): uprobes attach per file, not per process."""
    seen: dict[tuple[int, int], LibraryFile] = {}
    for p in procs:
        for lib in p.libs.values():
            seen.setdefault((lib.dev, lib.inode), lib)
    return list(seen.values())
