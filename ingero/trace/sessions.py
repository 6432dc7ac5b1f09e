"""Uprobe sessions (Linux 6.13+): one program at a function's entry and return, whose
entry decides whether the return runs at all.

A uprobe_multi link made with the attach type ``BPF_TRACE_UPROBE_SESSION`` runs its
program at entry; a return value of 1 there tells the kernel to skip the call's return
(no return probe is armed: the call costs what an entry-only uprobe costs), 0 to run the
program again at the return (kernel/trace/bpf_trace.c, ``uprobe_multi_link_handler``:
``return ret ? UPROBE_HANDLER_IGNORE : 0``). The program tells the two apart with the kfunc
``bpf_session_is_return()``, and keeps 8 bytes from entry to return through
``bpf_session_cookie()`` (tools/testing/selftests/bpf/progs/uprobe_multi_session_cookie.c).

BCC (0.26) cannot call kfuncs. bpf/ingero.bpf.c calls two placeholder helper ids instead
(``KFUNC_PLACEHOLDERS``), and ``patch_kfuncs`` turns those calls into kfunc calls
(``BPF_PSEUDO_KFUNC_CALL``, the kfunc's BTF id in vmlinux) before the program is loaded, as
libbpf's relocation would. The attach type's value and the kfunc ids come from the running
kernel's BTF (``kbtf``); whether the kernel takes such programs and links is asked by
loading a three-instruction program and making a link on ``/`` (``probe``).

The kernel's BTF also says where it keeps a process's uretprobe trampoline (``TRAMPOLINE``):
a launch counted at entry tells the runtime's own driver launch by the runtime's return
address still in its stack slot, and another tracer's return probe on the runtime's launch
puts the trampoline's address there instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from ingero.trace.kbtf import BtfFacts
from ingero.trace.uprobemulti import _NR_BPF, BPF_TRACE_UPROBE_MULTI, kernel_has_links

ATTACH_ENUM = "bpf_attach_type"
SESSION_ATTACH = "BPF_TRACE_UPROBE_SESSION"
IS_RETURN = "bpf_session_is_return"
COOKIE = "bpf_session_cookie"
# The helper ids bpf/ingero.bpf.c calls in their place (far above any real helper id).
KFUNC_PLACEHOLDERS = {IS_RETURN: 0x7FF00001, COOKIE: 0x7FF00002}
# The uretprobe trampoline's address, read from the current task: task_struct.mm, the mm's
# xol area (created at the process's first uprobe hit) and that area's address, where the
# trampoline is (kernel/events/uprobes.c, uprobe_get_trampoline_vaddr).
TRAMPOLINE = (("task_struct", "mm"), ("mm_struct", "uprobes_state.xol_area"), ("xol_area", "vaddr"))

BPF_PROG_LOAD = 5
BPF_PROG_TYPE_KPROBE = 2
_CALL = 0x85  # BPF_JMP | BPF_CALL
_LD_IMM64 = 0x18
_PSEUDO_KFUNC_CALL = 2
_INSN = struct.Struct("<BBhi")
# union bpf_attr as BPF_PROG_LOAD reads it, up to expected_attach_type: prog_type, insn_cnt,
# insns, license, log_level, log_size, log_buf, kern_version, prog_flags, prog_name[16],
# prog_ifindex, expected_attach_type.
_PROG_LOAD = struct.Struct("=IIQQIIQII16sII")
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class SessionKfuncs:
    """What a session program needs of this kernel: the attach type and the kfunc ids."""

    attach_type: int
    is_return: int
    cookie: int
    # The TRAMPOLINE members' byte offsets; () where the kernel's BTF lacks one (a foreign
    # return probe on a runtime launch then makes its driver launch count again).
    trampoline: tuple[int, ...] = ()

    def ids(self) -> dict[int, int]:
        """Placeholder helper id → kfunc BTF id."""
        return {KFUNC_PLACEHOLDERS[IS_RETURN]: self.is_return,
                KFUNC_PLACEHOLDERS[COOKIE]: self.cookie}  # fmt: skip


def kfuncs_from_btf(btf: BtfFacts) -> SessionKfuncs | str:
    """The session attach type and kfuncs of this kernel, or why it has none."""
    attach = btf.enum_value(ATTACH_ENUM, SESSION_ATTACH)
    if attach is None:
        return f"no {SESSION_ATTACH} in the kernel's enum {ATTACH_ENUM} (uprobe sessions: 6.13+)"
    ids = {}
    for name in (IS_RETURN, COOKIE):
        found = btf.func(name)
        if found is None:
            return f"no kfunc {name} in the kernel's BTF"
        # 6.13-6.18 declare both without arguments, later kernels with the program's context:
        # the program passes its context in r1 either way.
        if found[1] > 1:
            return f"kfunc {name} takes {found[1]} arguments (0 or 1 known)"
        ids[name] = found[0]
    offsets = [btf.member_offset(struct, path) for struct, path in TRAMPOLINE]
    trampoline = tuple(o for o in offsets if o is not None)
    return SessionKfuncs(attach, ids[IS_RETURN], ids[COOKIE],
                         trampoline if len(trampoline) == len(TRAMPOLINE) else ())  # fmt: skip


def patch_kfuncs(insns: bytes, ids: Mapping[int, int]) -> tuple[bytes, int]:
    """``insns`` with each call of a placeholder helper id made a call of its kfunc (by BTF
    id, in vmlinux), and how many there were. Other calls and constants stay."""
    out = bytearray(insns)
    n = 0
    i = 0
    while i + _INSN.size <= len(out):
        code, regs, _off, imm = _INSN.unpack_from(out, i)
        if code == _LD_IMM64:
            i += 2 * _INSN.size  # its second half is no instruction of its own
            continue
        if code == _CALL and regs >> 4 == 0 and imm in ids:
            _INSN.pack_into(out, i, code, (regs & 0x0F) | _PSEUDO_KFUNC_CALL << 4, 0, ids[imm])
            n += 1
        i += _INSN.size
    return bytes(out), n


def load_raw(insns: bytes, attach_type: int, name: bytes = b"ingero_probe") -> int:
    """Load ``insns`` as a kprobe-type program with ``attach_type`` (GPL: kfunc calls need
    it); returns its fd. Raises OSError with the kernel's errno."""
    code = ctypes.create_string_buffer(insns, len(insns))
    license_ = ctypes.create_string_buffer(b"GPL")
    attr = ctypes.create_string_buffer(
        _PROG_LOAD.pack(
            BPF_PROG_TYPE_KPROBE, len(insns) // _INSN.size, ctypes.addressof(code),
            ctypes.addressof(license_), 0, 0, 0, 0, 0, name[:15], 0, attach_type,
        ),
        _PROG_LOAD.size,
    )  # fmt: skip
    fd = int(_libc.syscall(ctypes.c_long(_NR_BPF), ctypes.c_long(BPF_PROG_LOAD), attr,
                           ctypes.c_uint(_PROG_LOAD.size)))  # fmt: skip
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"BPF program load refused: {os.strerror(err)}")
    return fd


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return _INSN.pack(code, src << 4 | dst, off, imm)


EXIT_0 = _insn(0xB7, 0, imm=0) + _insn(0x95)  # r0 = 0; exit


def _refusal(insns: bytes, attach_type: int, name: bytes, what: str, no_links: str) -> str | None:
    """Why the kernel refuses program ``what`` of ``attach_type`` or its links (``no_links``),
    None where it takes both."""
    try:
        fd = load_raw(insns, attach_type, name)
    except OSError as exc:
        return f"{what} does not load ({exc.strerror})"
    try:
        return None if kernel_has_links(fd, attach_type) else no_links
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def probe(kfuncs: SessionKfuncs | str) -> tuple[bool, str]:
    """Whether this kernel runs uprobe session programs: (yes/no, why)."""
    if isinstance(kfuncs, str):
        return False, kfuncs
    prog = _insn(_CALL, src=_PSEUDO_KFUNC_CALL, imm=kfuncs.is_return) + EXIT_0
    why = _refusal(prog, kfuncs.attach_type, b"ingero_session", "a session program",
                   "the kernel refuses uprobe session links")  # fmt: skip
    if why is not None:
        return False, why
    return True, f"{SESSION_ATTACH} ({kfuncs.attach_type}) and its kfuncs load and link"


def probe_links() -> tuple[bool, str]:
    """Whether this kernel has uprobe_multi links (6.6+): (yes/no, why)."""
    why = _refusal(EXIT_0, BPF_TRACE_UPROBE_MULTI, b"ingero_multi", "a uprobe_multi program",
                   "the kernel refuses uprobe_multi links (6.6+)")  # fmt: skip
    if why is not None:
        return False, why
    return True, "uprobe_multi links load and link"
