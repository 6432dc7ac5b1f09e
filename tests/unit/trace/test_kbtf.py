"""kbtf: functions, enum members and struct members' offsets from BTF blobs built here, and
garbage refused cleanly."""

from __future__ import annotations

import contextlib
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingero.trace.kbtf import VMLINUX, BtfError, KernelBtf, parse, read_kernel


class Blob:
    """A BTF blob: type records appended in order (ids from 1), then the strings."""

    def __init__(self) -> None:
        self.types = b""
        self.strings = b"\0"

    def name(self, text: str) -> int:
        off = len(self.strings)
        self.strings += text.encode() + b"\0"
        return off

    def add(self, name: str, kind: int, vlen: int, size_or_type: int, tail: bytes = b"",
            kind_flag: int = 0) -> None:  # fmt: skip
        info = kind_flag << 31 | kind << 24 | vlen
        self.types += struct.pack("<III", self.name(name) if name else 0, info, size_or_type)
        self.types += tail

    def bytes(self) -> bytes:
        hdr = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(self.types), len(self.types),
                          len(self.strings))  # fmt: skip
        return hdr + self.types + self.strings


def kernelish() -> Blob:
    b = Blob()
    b.add("int", 1, 0, 4, struct.pack("<I", 32))  # 1
    b.add("", 13, 2, 1, struct.pack("<IIII", b.name("a"), 1, b.name("b"), 1))  # 2: (int, int)
    b.add("", 13, 0, 1)  # 3: (void)
    b.add("with_two", 12, 1, 2)  # 4
    b.add("bpf_session_is_return", 12, 1, 3)  # 5
    members = [("BPF_TRACE_UPROBE_MULTI", 48), ("BPF_TRACE_UPROBE_SESSION", 57)]
    tail = b"".join(struct.pack("<Ii", b.name(n), v) for n, v in members)
    b.add("bpf_attach_type", 6, len(members), 4, tail)  # 6
    b.add("other_enum", 6, 1, 4, struct.pack("<Ii", b.name("NOT_KEPT"), 1))  # 7
    b.add("big", 19, 1, 8, struct.pack("<III", b.name("HUGE"), 1, 2))  # 8: ENUM64
    b.add("s", 4, 1, 8, struct.pack("<III", b.name("m"), 1, 0))  # 9: a struct, skipped
    # 10: struct outer {int a; struct {int x; nested_t nested;}; } (bit offsets 0, 64)
    b.add("outer", 4, 2, 24, struct.pack("<IIIIII", b.name("a"), 1, 0, 0, 11, 64))
    b.add("", 4, 2, 16, struct.pack("<IIIIII", b.name("x"), 1, 0, b.name("nested"), 12, 32))
    b.add("nested_t", 8, 0, 13)  # 12: a typedef of 13
    b.add("leaf", 4, 1, 8, struct.pack("<III", b.name("deep"), 1, 32))  # 13
    # 14: struct bits {int b:3;} at bit 5 (kind_flag: the size in the offset's top 8 bits)
    b.add("bits", 4, 1, 4, struct.pack("<III", b.name("b"), 1, 3 << 24 | 5), kind_flag=1)
    return b


def loaded() -> KernelBtf:
    try:
        return parse(kernelish().bytes())
    except BtfError as exc:
        if "not found" in str(exc):
            pytest.skip(str(exc))
        raise


def test_functions_with_their_ids_and_parameter_counts() -> None:
    with loaded() as btf:
        assert btf.func("with_two") == (4, 2)
        assert btf.func("bpf_session_is_return") == (5, 0)
        assert btf.func("nope") is None
        assert btf.func("int") is None  # a type of another kind is no function


def test_enum_members_enum64_too() -> None:
    with loaded() as btf:
        assert btf.enum_value("bpf_attach_type", "BPF_TRACE_UPROBE_SESSION") == 57
        assert btf.enum_value("bpf_attach_type", "BPF_TRACE_UPROBE_MULTI") == 48
        assert btf.enum_value("bpf_attach_type", "NOPE") is None
        assert btf.enum_value("nope", "BPF_TRACE_UPROBE_MULTI") is None
        assert btf.enum_value("big", "HUGE") == 1 | 2 << 32


def test_member_offsets_through_anonymous_members_and_typedefs() -> None:
    with loaded() as btf:
        assert btf.member_offset("outer", "a") == 0
        assert btf.member_offset("outer", "x") == 8  # in the anonymous struct at byte 8
        assert btf.member_offset("outer", "nested.deep") == 8 + 4 + 4
        assert btf.member_offset("outer", "nope") is None
        assert btf.member_offset("outer", "a.b") is None  # an int has no members
        assert btf.member_offset("bits", "b") is None  # a bitfield has no byte offset
        assert btf.member_offset("nested_t", "deep") is None  # a struct's name, not a typedef's
        assert btf.member_offset("nope", "a") is None


@pytest.mark.parametrize("blob", [b"", b"\0" * 24, kernelish().bytes()[:40]])
def test_blobs_libbpf_refuses_raise_btferror(blob: bytes) -> None:
    loaded().close()  # skips where libbpf is missing
    with pytest.raises(BtfError, match="libbpf refuses the BTF"):
        parse(blob)


@given(st.binary(max_size=256))
def test_garbage_raises_btferror_or_loads(data: bytes) -> None:
    loaded().close()
    with contextlib.suppress(BtfError), parse(data) as btf:
        btf.func("with_two")
        btf.enum_value("bpf_attach_type", "X")
        btf.member_offset("outer", "nested.deep")


def test_no_btf_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(BtfError, match="no kernel BTF"):
        read_kernel(tmp_path / "vmlinux")


@pytest.mark.skipif(not Path(VMLINUX).exists(), reason="this kernel has no BTF")
def test_the_running_kernel_names_its_bpf_attach_types() -> None:
    loaded().close()
    with read_kernel() as btf:
        # 48 on every kernel that has it (uprobemulti.py uses it).
        assert btf.enum_value("bpf_attach_type", "BPF_TRACE_UPROBE_MULTI") in (48, None)
        assert btf.func("bpf_prog_put") is not None
        # Every kernel with BTF has a task's mm (sessions.TRAMPOLINE's first member).
        assert btf.member_offset("task_struct", "mm") is not None
