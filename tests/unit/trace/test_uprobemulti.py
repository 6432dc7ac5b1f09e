"""The BPF_LINK_CREATE attr uprobemulti.py packs: the kernel UAPI's field offsets."""

from __future__ import annotations

import errno
import os
import struct

import pytest

from ingero.trace import uprobemulti


def test_attr_fields_sit_where_linux_uapi_bpf_h_puts_them() -> None:
    # include/uapi/linux/bpf.h, union bpf_attr, link_create: prog_fd 0, target_fd 4,
    # attach_type 8, flags 12, then uprobe_multi {path 16, offsets 24, ref_ctr_offsets 32,
    # cookies 40, cnt 48, flags 52, pid 56}.
    raw = uprobemulti._ATTR.pack(3, 0, 48, 0, 0x1111, 0x2222, 0, 0, 7, 1, 42)
    assert len(raw) == 64
    assert struct.unpack_from("=IIII", raw, 0) == (3, 0, 48, 0)
    assert struct.unpack_from("=QQQQ", raw, 16) == (0x1111, 0x2222, 0, 0)
    assert struct.unpack_from("=III", raw, 48) == (7, 1, 42)
    assert raw[60:] == b"\0\0\0\0"  # the kernel refuses a non-zero tail it does not know


def test_a_link_needs_an_offset() -> None:
    with pytest.raises(ValueError, match="at least one offset"):
        uprobemulti.link_create(0, b"/nonexistent", [], retprobe=False)


def test_a_refused_link_says_which_file_and_why() -> None:
    # /dev/null is no BPF program: the kernel refuses (EINVAL; EPERM without privileges),
    # and the error carries its errno and the file's name.
    fd = os.open("/dev/null", os.O_RDONLY)
    try:
        with pytest.raises(
            OSError, match=r"^\[Errno \d+\] uprobe_multi link on /lib/no\.so: "
        ) as err:
            uprobemulti.link_create(fd, b"/lib/no.so", [0x1000], retprobe=True)
        assert err.value.errno in (errno.EINVAL, errno.EPERM, errno.EBADF)
    finally:
        os.close(fd)
