"""tailcall.retarget_map: a program's map references moved to another map, nothing else."""

from __future__ import annotations

import struct

from ingero.trace.tailcall import retarget_map

INSN = struct.Struct("<BBhi")


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return INSN.pack(code, src << 4 | dst, off, imm)


def ld_map(dst: int, fd: int, pseudo: int = 1) -> bytes:
    """ld_imm64 of a map (src_reg BPF_PSEUDO_MAP_FD): two slots, the second all zero."""
    return insn(0x18, dst, pseudo, 0, fd) + insn(0, 0, 0, 0, 0)


def test_each_reference_to_the_map_moves_to_the_other_one() -> None:
    prog = (
        insn(0xB7, 1, imm=7)  # r1 = 7: a constant equal to the fd is no map
        + ld_map(2, 7)
        + insn(0x85, imm=12)  # call bpf_tail_call
        + ld_map(2, 7)
        + insn(0x95)  # exit
    )
    out, n = retarget_map(prog, 7, 9)
    assert n == 2
    assert len(out) == len(prog)
    moved = ld_map(2, 9)
    assert out == insn(0xB7, 1, imm=7) + moved + insn(0x85, imm=12) + moved + insn(0x95)


def test_other_maps_and_plain_wide_constants_stay() -> None:
    # another map; a 64-bit constant (src_reg 0) whose low half equals the fd; a map value
    # reference (BPF_PSEUDO_MAP_VALUE, 2) is left too; and the second half of an ld_imm64
    # that reads like a ld_imm64 opcode is not taken for one.
    prog = ld_map(1, 8) + ld_map(1, 7, pseudo=0) + ld_map(1, 7, pseudo=2)
    prog += insn(0x18, 1, 1, 0, 5) + insn(0x18, 0, 1, 0, 7)
    out, n = retarget_map(prog, 7, 9)
    assert (out, n) == (prog, 0)
