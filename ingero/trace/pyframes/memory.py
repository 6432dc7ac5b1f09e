"""Read another process's memory: ``process_vm_readv`` (one syscall, no ptrace stop).

/proc/PID/mem is the fallback where the syscall is unavailable (ENOSYS in some
sandboxes). Either raises ``ReadError`` for memory that is not mapped or readable, or a
process that exited: the caller turns it into a reason, never into a frame.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct


class ReadError(OSError):
    """The bytes could not be read (unmapped address, exited process, no permission)."""


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_readv = getattr(_libc, "process_vm_readv", None)
if _readv is not None:
    _readv.restype = ctypes.c_ssize_t
    _readv.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                       ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong]  # fmt: skip

MAX_READ = 1 << 20  # no single read of a walk needs more


class Memory:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._use_syscall = _readv is not None

    def read(self, addr: int, size: int) -> bytes:
        if size <= 0 or size > MAX_READ or addr <= 0 or addr + size >= 1 << 64:
            raise ReadError(f"bad read of {size} bytes at {addr:#x}")
        if self._use_syscall:
            buf = ctypes.create_string_buffer(size)
            local = _IoVec(ctypes.cast(buf, ctypes.c_void_p), size)
            remote = _IoVec(addr, size)
            assert _readv is not None
            n = _readv(self.pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
            if n == size:
                return buf.raw
            err = ctypes.get_errno()
            if n < 0 and err == 38:  # ENOSYS: fall back to /proc/PID/mem from now on
                self._use_syscall = False
            else:
                raise ReadError(err, f"pid {self.pid}: cannot read {size} bytes at {addr:#x}")
        try:
            with open(f"/proc/{self.pid}/mem", "rb", buffering=0) as f:
                f.seek(addr)
                data = f.read(size)
        except (OSError, OverflowError, ValueError) as exc:
            raise ReadError(
                f"pid {self.pid}: cannot read {size} bytes at {addr:#x}: {exc}"
            ) from None
        if len(data) != size:
            raise ReadError(f"pid {self.pid}: short read at {addr:#x}")
        return data

    def u64(self, addr: int) -> int:
        return int(struct.unpack("<Q", self.read(addr, 8))[0])

    def alive(self) -> bool:
        return os.path.exists(f"/proc/{self.pid}")
