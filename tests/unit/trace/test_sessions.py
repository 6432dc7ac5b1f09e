"""Uprobe sessions: the kfunc patch, what BTF must hold, the facilities and the launch mode."""

from __future__ import annotations

import struct

import pytest

from ingero.trace import facilities, sessions
from ingero.trace.facilities import Facilities, parse_version, seccomp_passthrough
from ingero.trace.kbtf import StaticBtf

INSN = struct.Struct("<BBhi")
IS_RETURN = sessions.KFUNC_PLACEHOLDERS[sessions.IS_RETURN]
COOKIE = sessions.KFUNC_PLACEHOLDERS[sessions.COOKIE]


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return INSN.pack(code, src << 4 | dst, off, imm)


def test_placeholder_calls_become_kfunc_calls_by_btf_id() -> None:
    prog = (
        insn(0x85, imm=IS_RETURN)
        + insn(0x85, imm=14)  # a real helper (bpf_get_current_pid_tgid) stays
        + insn(0x85, imm=COOKIE)
        + insn(0xB7, 0, imm=IS_RETURN)  # a constant equal to a placeholder stays
        + insn(0x95)
    )
    out, n = sessions.patch_kfuncs(prog, {IS_RETURN: 65016, COOKIE: 65014})
    assert n == 2
    assert out == (
        insn(0x85, src=2, imm=65016)
        + insn(0x85, imm=14)
        + insn(0x85, src=2, imm=65014)
        + insn(0xB7, 0, imm=IS_RETURN)
        + insn(0x95)
    )


def test_the_second_half_of_a_wide_load_is_not_read_as_a_call() -> None:
    # ld_imm64 whose second slot reads like `call IS_RETURN`.
    prog = insn(0x18, 1, 0, 0, 7) + insn(0x85, imm=IS_RETURN) + insn(0x95)
    out, n = sessions.patch_kfuncs(prog, {IS_RETURN: 1})
    assert (out, n) == (prog, 0)


def btf(enum: int | None = 57, is_return: tuple[int, int] | None = (9, 0)) -> StaticBtf:
    funcs = {"bpf_session_cookie": (8, 0)}
    if is_return is not None:
        funcs["bpf_session_is_return"] = is_return
    enums = {} if enum is None else {("bpf_attach_type", "BPF_TRACE_UPROBE_SESSION"): enum}
    return StaticBtf(funcs, enums)


def test_kfuncs_and_attach_type_come_from_btf() -> None:
    assert sessions.kfuncs_from_btf(btf()) == sessions.SessionKfuncs(57, 9, 8)
    assert sessions.kfuncs_from_btf(btf(is_return=(9, 1))) == sessions.SessionKfuncs(57, 9, 8)


def test_the_trampolines_offsets_come_from_btf_all_or_none() -> None:
    members = {("task_struct", "mm"): 1136, ("mm_struct", "uprobes_state.xol_area"): 1368,
               ("xol_area", "vaddr"): 40}  # fmt: skip
    found = sessions.kfuncs_from_btf(StaticBtf(btf().funcs, btf().enums, members))
    assert found == sessions.SessionKfuncs(57, 9, 8, (1136, 1368, 40))
    del members[("xol_area", "vaddr")]  # a kernel that keeps it elsewhere: not read at all
    found = sessions.kfuncs_from_btf(StaticBtf(btf().funcs, btf().enums, members))
    assert found == sessions.SessionKfuncs(57, 9, 8)


@pytest.mark.parametrize(
    ("given", "why"),
    [
        (btf(enum=None), "no BPF_TRACE_UPROBE_SESSION"),
        (btf(is_return=None), "no kfunc bpf_session_is_return"),
        (btf(is_return=(9, 3)), "takes 3 arguments"),
    ],
)
def test_a_kernel_without_them_says_why(given: StaticBtf, why: str) -> None:
    found = sessions.kfuncs_from_btf(given)
    assert isinstance(found, str) and why in found
    assert sessions.probe(found) == (False, found)


def test_the_program_load_attr_sits_where_uapi_bpf_h_puts_it() -> None:
    # union bpf_attr, BPF_PROG_LOAD: prog_type 0, insn_cnt 4, insns 8, license 16,
    # log_level 24, log_size 28, log_buf 32, kern_version 40, prog_flags 44,
    # prog_name 48 (16 bytes), prog_ifindex 64, expected_attach_type 68.
    raw = sessions._PROG_LOAD.pack(2, 3, 0x10, 0x20, 0, 0, 0, 0, 0, b"name", 0, 57)
    assert len(raw) == 72
    assert struct.unpack_from("=II", raw, 0) == (2, 3)
    assert struct.unpack_from("=QQ", raw, 8) == (0x10, 0x20)
    assert raw[48:52] == b"name"
    assert struct.unpack_from("=II", raw, 64) == (0, 57)


@pytest.mark.parametrize(
    ("release", "version"),
    [("6.18.44-fc-v1300", (6, 18, 44)), ("6.12", (6, 12, 0)), ("5.15.0-91-generic", (5, 15, 0)),
     ("junk", (0, 0, 0))],
)  # fmt: skip
def test_versions(release: str, version: tuple[int, int, int]) -> None:
    assert parse_version(release) == version


@pytest.mark.parametrize(
    ("release", "fixed"),
    [("6.11.11", False), ("6.12.13", False), ("6.12.14", True), ("6.13.2", False),
     ("6.13.3", True), ("6.14.0-rc1", True), ("6.18.44", True), ("7.0", True),
     ("6.10.14", False)],
)  # fmt: skip
def test_the_seccomp_passthrough_by_version(release: str, fixed: bool) -> None:
    assert seccomp_passthrough(release) is fixed


def fac(release: str = "6.18.44", **kw: object) -> Facilities:
    base: dict[str, object] = dict(release=release, uprobe_multi=True, uprobe_multi_why="ok",
                                   sessions=True, sessions_why="ok", uretprobe_syscall=True)  # fmt: skip
    base.update(kw)
    return Facilities(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("given", "hazard"),
    [
        (fac("6.12.13"), True),  # the syscall, and no fix
        (fac("6.13.1"), True),
        (fac("6.13.3"), False),  # fixed
        (fac("6.12.13", uretprobe_syscall=False), False),  # not x86: no such syscall
        (fac("6.8.0", uretprobe_syscall=None), False),  # no BTF, older than the syscall
        (fac("6.12.2", uretprobe_syscall=None), True),  # no BTF, in the range
    ],
)
def test_the_hazard(given: Facilities, hazard: bool) -> None:
    assert given.seccomp_hazard is hazard


def test_sessions_give_sampled_launches() -> None:
    mode, why = fac().launch_mode()
    assert mode == facilities.LAUNCH_SAMPLED and "sessions" in why
    assert fac().launch_mode(facilities.LAUNCH_SAMPLED)[0] == facilities.LAUNCH_SAMPLED


@pytest.mark.parametrize(
    ("given", "kw", "why"),
    [
        (fac(sessions=False, sessions_why="no BPF_TRACE_UPROBE_SESSION"), {}, "no uprobe sessions"),
        (fac(uprobe_multi=False, sessions=False), {}, "no uprobe_multi links"),
        (fac(), {"task_storage": False}, "no task-local storage"),
        (fac(), {"multi": False}, "links are off"),
    ],
)
def test_without_them_every_launch_is_timed_and_says_why(
    given: Facilities, kw: dict[str, bool], why: str
) -> None:
    mode, said = given.launch_mode(facilities.LAUNCH_AUTO, **kw)
    assert mode == facilities.LAUNCH_ALL and why in said
    with pytest.raises(ValueError, match=f"cannot run here: .*{why}"):
        given.launch_mode(facilities.LAUNCH_SAMPLED, **kw)


def test_all_is_all_and_a_bad_mode_is_refused() -> None:
    assert fac().launch_mode(facilities.LAUNCH_ALL)[0] == facilities.LAUNCH_ALL
    with pytest.raises(ValueError, match="one of auto, sampled, all"):
        fac().launch_mode("some")
