"""uprobe_multi links (Linux 6.6+): a BPF program attached at many offsets of one file.

Why not BCC's perf-event uprobes alone: the kernel unregisters a perf-event uprobe behind
one global mutex and waits for RCU grace periods each time, so closing them costs about
0.1 s each, one after another (6 s for an idle node's ~50 probes, 22-50 s on a GPU node
with PyTorch's libraries attached), and no number of threads overlaps them. A uprobe_multi
link waits once per link, and outside that mutex: closing 40 of them from 40 threads took
0.18 s here, where 20 perf-event uprobes took 2.8 s. BCC (0.26) cannot create these links,
so this module makes the one ``bpf(BPF_LINK_CREATE)`` call itself; BCC still compiles and
loads the program (``load_func(..., attach_type=BPF_TRACE_UPROBE_MULTI)``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import struct
import threading
from collections.abc import Iterable, Sequence

BPF_LINK_CREATE = 28  # enum bpf_cmd
BPF_TRACE_UPROBE_MULTI = 48  # enum bpf_attach_type
UPROBE_MULTI_RETURN = 1  # link_create.uprobe_multi.flags
_NR_BPF = 321  # x86-64, the only architecture the tracer reads registers for
# union bpf_attr as BPF_LINK_CREATE reads it: prog_fd, target_fd, attach_type, flags, then
# uprobe_multi {path, offsets, ref_ctr_offsets, cookies, cnt, flags, pid}. The kernel
# accepts a shorter attr than its own if the bytes it knows past ours would be zero, and
# a longer one if our extra bytes are zero: 64 bytes, zero-filled, carry every field.
_ATTR = struct.Struct("=IIII QQQQ III 4x")
_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def link_create(
    prog_fd: int,
    path: bytes,
    offsets: Sequence[int],
    retprobe: bool,
    pid: int = 0,
    attach_type: int = BPF_TRACE_UPROBE_MULTI,
) -> int:
    """A link attaching ``prog_fd`` at each file offset of ``path`` (their returns with
    ``retprobe``), in process ``pid`` only (0: every process). Returns the link's fd;
    closing it detaches every offset. Raises OSError with the kernel's errno.
    ``attach_type``: the program's (``BPF_TRACE_UPROBE_SESSION`` for a session link,
    ingero/trace/sessions.py: entry and return in one link, no ``retprobe``)."""
    if not offsets:
        raise ValueError("a uprobe_multi link needs at least one offset")
    c_path = ctypes.create_string_buffer(path)
    c_offsets = (ctypes.c_uint64 * len(offsets))(*offsets)
    attr = ctypes.create_string_buffer(
        _ATTR.pack(
            prog_fd,
            0,
            attach_type,
            0,
            ctypes.addressof(c_path),
            ctypes.addressof(c_offsets),
            0,
            0,
            len(offsets),
            UPROBE_MULTI_RETURN if retprobe else 0,
            pid,
        ),
        _ATTR.size,
    )
    fd = int(_syscall(_NR_BPF, BPF_LINK_CREATE, attr, _ATTR.size))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"uprobe_multi link on {path.decode(errors='replace')}: "
                      f"{os.strerror(err)}")  # fmt: skip
    return fd


def kernel_has_links(prog_fd: int, attach_type: int = BPF_TRACE_UPROBE_MULTI) -> bool:
    """Whether this kernel has uprobe_multi links (or links of ``attach_type``: uprobe
    sessions), asked through ``prog_fd`` (a program loaded with that attach type) as libbpf
    asks: a link on ``/`` fails with EBADF (a directory is no file to probe) where the
    kernel has them, and with EINVAL where it does not (before 6.6 it knows neither the
    attach type nor the attr's uprobe_multi fields)."""
    try:
        _close(link_create(prog_fd, b"/", [0], retprobe=False, attach_type=attach_type))
    except OSError as exc:
        return exc.errno == errno.EBADF
    return False  # a link on a directory: nothing this module knows of


def close_all(fds: Iterable[int]) -> None:
    """Close links side by side: each close waits for its own grace period, and they
    overlap (one thread per link; a tracer holds at most a few hundred)."""
    threads = [threading.Thread(target=_close, args=(fd,), daemon=True) for fd in fds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):  # closed already: nothing is attached through it
        os.close(fd)
