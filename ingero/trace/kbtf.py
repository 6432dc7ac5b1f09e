"""What the running kernel's BTF (``/sys/kernel/btf/vmlinux``) says: functions, enums and
where a struct keeps a member.

The tracer never takes a kernel fact from headers (a node's headers may be another
kernel's): the uprobe session attach type, the BTF ids of the session kfuncs and whether
the kernel has the uretprobe syscall are read here, from the kernel itself, and so are the
offsets of the few kernel fields the program reads (BCC compiles against the headers
installed, which may be another kernel's: a layout from them may be wrong). Through
libbpf's BTF API (``libbpf.so.1``: Debian's libbpf1, which libbpfcc depends on, so it is
there wherever BCC is): libbpf parses and checks the blob; this module asks it for a
function, an enum or a struct by name and reads the few fields of the records it returns
(the ``btf_type``, ``btf_enum`` and ``btf_member`` layouts of ``include/uapi/linux/btf.h``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

VMLINUX = Path("/sys/kernel/btf/vmlinux")
LIBBPF = "libbpf.so.1"
KIND_ENUM, KIND_FUNC, KIND_ENUM64 = 6, 12, 19
KIND_STRUCT, KIND_UNION = 4, 5
# What a member's type may be wrapped in on the way to its struct: typedef, volatile,
# const, restrict, type tag.
_WRAPPERS = frozenset({8, 9, 10, 11, 18})


class BtfError(ValueError):
    """No BTF to read: libbpf missing, or a blob it refuses."""


class BtfFacts(Protocol):
    """What the tracer asks of a kernel's BTF."""

    def func(self, name: str) -> tuple[int, int] | None:
        """A function's BTF type id and parameter count; None where there is none."""
        ...

    def enum_value(self, enum: str, member: str) -> int | None: ...

    def member_offset(self, struct: str, path: str) -> int | None:
        """The byte offset of ``path`` (members joined by dots, through anonymous structs
        and unions) in struct ``struct``; None where there is no such member."""
        ...


@dataclass(frozen=True)
class StaticBtf:
    """BTF facts given as tables (tests; a kernel whose facts are known)."""

    funcs: dict[str, tuple[int, int]] = field(default_factory=dict)
    enums: dict[tuple[str, str], int] = field(default_factory=dict)
    members: dict[tuple[str, str], int] = field(default_factory=dict)

    def func(self, name: str) -> tuple[int, int] | None:
        return self.funcs.get(name)

    def enum_value(self, enum: str, member: str) -> int | None:
        return self.enums.get((enum, member))

    def member_offset(self, struct: str, path: str) -> int | None:
        return self.members.get((struct, path))


class _Type(ctypes.Structure):
    # struct btf_type: name_off, info (kind in bits 24-28, vlen in 0-15), size or type.
    _fields_ = [("name_off", ctypes.c_uint32), ("info", ctypes.c_uint32),
                ("size_or_type", ctypes.c_uint32)]  # fmt: skip


class _Enum(ctypes.Structure):
    _fields_ = [("name_off", ctypes.c_uint32), ("val", ctypes.c_int32)]


class _Enum64(ctypes.Structure):
    _fields_ = [("name_off", ctypes.c_uint32), ("lo", ctypes.c_uint32), ("hi", ctypes.c_uint32)]


class _Member(ctypes.Structure):
    # struct btf_member: offset in bits (kind_flag set: bitfield size in its top 8 bits).
    _fields_ = [("name_off", ctypes.c_uint32), ("type", ctypes.c_uint32),
                ("offset", ctypes.c_uint32)]  # fmt: skip


_lib: Any = None


def _libbpf() -> Any:
    global _lib
    if _lib is None:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("bpf") or LIBBPF, use_errno=True)
        except OSError as exc:
            raise BtfError(f"{LIBBPF} not found (install libbpf1): {exc}") from None
        # libbpf prints what it refuses on stderr; the refusal comes back as a BtfError.
        lib.libbpf_set_print.argtypes = [ctypes.c_void_p]
        lib.libbpf_set_print.restype = ctypes.c_void_p
        lib.libbpf_set_print(None)
        lib.btf__new.restype = ctypes.c_void_p
        lib.btf__new.argtypes = [ctypes.c_char_p, ctypes.c_uint32]
        lib.btf__free.argtypes = [ctypes.c_void_p]
        lib.btf__find_by_name_kind.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint32]
        lib.btf__find_by_name_kind.restype = ctypes.c_int32
        lib.btf__type_by_id.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
        lib.btf__type_by_id.restype = ctypes.POINTER(_Type)
        lib.btf__name_by_offset.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
        lib.btf__name_by_offset.restype = ctypes.c_char_p
        _lib = lib
    return _lib


class KernelBtf:
    """A BTF blob loaded by libbpf; ``close`` frees it."""

    def __init__(self, handle: int) -> None:
        self._btf = handle

    def close(self) -> None:
        if self._btf:
            _libbpf().btf__free(self._btf)
            self._btf = 0

    def __enter__(self) -> KernelBtf:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _find(self, name: str, kind: int) -> int:
        return int(_libbpf().btf__find_by_name_kind(self._btf, name.encode(), kind))

    def func(self, name: str) -> tuple[int, int] | None:
        fid = self._find(name, KIND_FUNC)
        if fid <= 0:
            return None
        lib = _libbpf()
        proto = lib.btf__type_by_id(self._btf, lib.btf__type_by_id(self._btf, fid)[0].size_or_type)
        return fid, (proto[0].info & 0xFFFF) if proto else -1

    def enum_value(self, enum: str, member: str) -> int | None:
        lib = _libbpf()
        for kind, record in ((KIND_ENUM, _Enum), (KIND_ENUM64, _Enum64)):
            tid = self._find(enum, kind)
            if tid <= 0:
                continue
            t = lib.btf__type_by_id(self._btf, tid)
            members = ctypes.cast(
                ctypes.addressof(t[0]) + ctypes.sizeof(_Type), ctypes.POINTER(record)
            )
            for i in range(t[0].info & 0xFFFF):
                m = members[i]
                if lib.btf__name_by_offset(self._btf, m.name_off) == member.encode():
                    return int(m.val) if kind == KIND_ENUM else int(m.lo | m.hi << 32)
        return None

    def member_offset(self, struct: str, path: str) -> int | None:
        tid = self._find(struct, KIND_STRUCT)
        if tid <= 0:
            return None
        total = 0
        for name in path.split("."):
            found = self._member(tid, name.encode(), 0)
            if found is None:
                return None
            bits, tid = found
            if bits % 8:
                return None  # a bitfield: no byte to read
            total += bits // 8
        return total

    def _member(self, tid: int, name: bytes, depth: int) -> tuple[int, int] | None:
        """(bit offset, type id) of member ``name`` of struct or union ``tid``, looked for
        in its anonymous members too (mm_struct keeps nearly all of its in one)."""
        lib = _libbpf()
        t = lib.btf__type_by_id(self._btf, tid)
        for _ in range(16):  # the wrappers on the way to the struct
            if not t or (t[0].info >> 24) & 0x1F not in _WRAPPERS:
                break
            tid = t[0].size_or_type
            t = lib.btf__type_by_id(self._btf, tid)
        if not t or (t[0].info >> 24) & 0x1F not in (KIND_STRUCT, KIND_UNION) or depth > 8:
            return None
        bitfields = t[0].info >> 31
        members = ctypes.cast(ctypes.addressof(t[0]) + ctypes.sizeof(_Type),
                              ctypes.POINTER(_Member))  # fmt: skip
        for i in range(t[0].info & 0xFFFF):
            m = members[i]
            at = m.offset & 0xFFFFFF if bitfields else m.offset
            if m.name_off == 0:
                inner = self._member(m.type, name, depth + 1)
                if inner is not None:
                    return at + inner[0], inner[1]
            elif lib.btf__name_by_offset(self._btf, m.name_off) == name:
                return at, m.type
        return None


def parse(data: bytes) -> KernelBtf:
    """A BTF blob held in memory (raw, as /sys/kernel/btf/vmlinux is)."""
    handle = _libbpf().btf__new(data, len(data))
    if not handle:
        err = ctypes.get_errno() or errno.EINVAL
        raise BtfError(f"libbpf refuses the BTF: {os.strerror(err)}")
    return KernelBtf(handle)


def read_kernel(path: Path = VMLINUX) -> KernelBtf:
    """The running kernel's BTF; raises BtfError where it has none or libbpf is missing."""
    if not path.exists():
        raise BtfError(f"{path}: no kernel BTF (CONFIG_DEBUG_INFO_BTF)")
    return parse(path.read_bytes())
