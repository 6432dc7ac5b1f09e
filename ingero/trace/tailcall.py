"""The stack walk's tail call, for probes loaded with either attach type.

Every probe hands a sample with a stack to one program, ``stack_sample``, by a tail call
through ``stack_progs`` (bpf/ingero.bpf.c says why). The kernel (6.18 here) lets a program
tail-call only programs loaded with its own expected attach type, and a prog array takes
the attach type of the first program that uses it: the perf-event probes and
``stack_sample`` are loaded without one, the probes of uprobe_multi links with
``BPF_TRACE_UPROBE_MULTI``. BCC compiles the program once, with one map, so a probe loaded
for a link gets its instructions' reference to ``stack_progs`` changed to
``stack_progs_multi`` (the relocation libbpf would make), which holds a uprobe_multi copy
of ``stack_sample``. BCC (0.26) has no such step, so this module loads those programs
itself, through libbcc's own ``bcc_func_load`` (BTF line info and all, as ``load_func``).
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Callable
from typing import Any

from ingero.trace.bccload import load_bcc

STACK_SAMPLER = b"stack_sample"
STACK_PROGS = b"stack_progs"
STACK_PROGS_MULTI = b"stack_progs_multi"
STACK_PROGS_SESSION = b"stack_progs_session"

# struct bpf_insn: code, dst_reg:4 src_reg:4, off, imm. A map reference is a 16-byte
# ld_imm64 (BPF_LD | BPF_IMM | BPF_DW) whose src_reg says the imm is a map fd.
_INSN = struct.Struct("<BBhi")
_LD_IMM64 = 0x18
_BPF_PSEUDO_MAP_FD = 1


def retarget_map(insns: bytes, old_fd: int, new_fd: int) -> tuple[bytes, int]:
    """``insns`` with each reference to map fd ``old_fd`` made to ``new_fd`` instead, and
    how many there were. Only ld_imm64 map references change: an equal constant is left."""
    out = bytearray(insns)
    n = 0
    i = 0
    while i + _INSN.size <= len(out):
        code, regs, off, imm = _INSN.unpack_from(out, i)
        if code != _LD_IMM64:
            i += _INSN.size
            continue
        if regs >> 4 == _BPF_PSEUDO_MAP_FD and imm == old_fd:
            _INSN.pack_into(out, i, code, regs, off, new_fd)
            n += 1
        i += 2 * _INSN.size  # the second half of an ld_imm64 is no instruction of its own
    return bytes(out), n


def _bcc_load(bpf: Any, name: bytes, insns: bytes, attach_type: int) -> int:
    """Load ``insns`` as program ``name`` of ``bpf``'s module, a kprobe program with
    ``attach_type``: libbcc's own loader, as BCC's ``load_func`` calls it."""
    lib = load_bcc().libbcc.lib
    code = ctypes.create_string_buffer(insns, len(insns))
    fd: int = lib.bcc_func_load(
        bpf.module, type(bpf).KPROBE, name, code, len(insns),
        lib.bpf_module_license(bpf.module), lib.bpf_module_kern_version(bpf.module),
        0, None, 0, None, attach_type,
    )  # fmt: skip
    if fd < 0:
        err = ctypes.get_errno() or errno.EINVAL
        raise OSError(err, f"cannot load BPF program {name.decode()}: {os.strerror(err)}")
    return fd


def _insns(bpf: Any, name: bytes) -> bytes:
    lib = load_bcc().libbcc.lib
    start = lib.bpf_function_start(bpf.module, name)
    if not start:
        raise OSError(errno.ENOENT, f"no BPF program {name.decode()}")
    return ctypes.string_at(start, lib.bpf_function_size(bpf.module, name))


def link_sampler(bpf: Any) -> None:
    """``stack_sample`` loaded as BCC loads a perf-event probe, in ``stack_progs``: before
    any probe attaches (a probe that finds the slot empty counts its sample dropped)."""
    fn = bpf.load_func(STACK_SAMPLER, type(bpf).KPROBE)
    bpf[STACK_PROGS][ctypes.c_int(0)] = ctypes.c_int(fn.fd)


def link_multi_sampler(bpf: Any, attach_type: int, prog_array: bytes = STACK_PROGS_MULTI) -> int:
    """A copy of ``stack_sample`` with ``attach_type`` in ``prog_array``; returns its fd
    (the map holds the program; the caller closes the fd at the end)."""
    fd = _bcc_load(bpf, STACK_SAMPLER, _insns(bpf, STACK_SAMPLER), attach_type)
    try:
        bpf[prog_array][ctypes.c_int(0)] = ctypes.c_int(fd)
    except Exception:
        os.close(fd)
        raise
    return fd


def load_multi(
    bpf: Any,
    name: bytes,
    attach_type: int,
    prog_array: bytes | None = STACK_PROGS_MULTI,
    patch: Callable[[bytes], bytes] | None = None,
) -> Any:
    """Program ``name`` with ``attach_type``, its tail call through ``prog_array`` (None:
    a program without stacks, which makes none), its instructions through ``patch`` (the
    session kfuncs, sessions.py), cached in BCC's table of loaded programs as ``load_func``
    caches it (closed by BCC's cleanup)."""
    insns = _insns(bpf, name)
    if prog_array is not None:
        insns, _ = retarget_map(insns, bpf[STACK_PROGS].map_fd, bpf[prog_array].map_fd)
    if patch is not None:
        insns = patch(insns)
    fn = type(bpf).Function(bpf, name, _bcc_load(bpf, name, insns, attach_type))
    bpf.funcs[name] = fn
    return fn
