"""Events to journald over its native protocol, written by hand (no libsystemd binding).

The protocol (systemd.io/JOURNAL_NATIVE_PROTOCOL): one datagram per entry on
``/run/systemd/journal/socket``; each field is ``NAME=value\\n``, or, when the value holds a
newline, ``NAME\\n`` + the value's length as little-endian 64-bit + the value + ``\\n``.
An entry too large for a datagram is written to a sealed memfd whose descriptor is passed
instead. Sends never block: a full socket buffer is a counted drop.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import socket
import struct
import threading

from ingero.events import Event
from ingero.systemd import JOURNAL_SOCKET

log = logging.getLogger(__name__)

_NAME_RE = re.compile(r"^[A-Z0-9][A-Z0-9_]{0,63}$")
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL


def encode_fields(fields: dict[str, str]) -> bytes:
    """One journal entry in the native wire format; bad field names raise ValueError."""
    out = bytearray()
    for name, value in fields.items():
        if not _NAME_RE.match(name):
            raise ValueError(f"invalid journal field name {name!r}")
        data = value.encode("utf-8", "replace")
        if b"\n" in data:
            out += name.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += name.encode() + b"=" + data + b"\n"
    return bytes(out)


class JournaldChannel:
    name = "journald"

    def __init__(self, path: str = JOURNAL_SOCKET) -> None:
        self._path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._lock = threading.Lock()
        self._counts = {"sent": 0, "dropped": 0, "errors": 0}

    def send(self, event: Event) -> None:
        try:
            payload = encode_fields(event.journal_fields())
            self._send(payload)
        except BlockingIOError:
            self._count("dropped")
        except (OSError, ValueError) as exc:
            # journald absent or refusing: counted; the push loop goes on.
            self._count("errors")
            log.debug("journald: %s", exc)
        else:
            self._count("sent")

    def _send(self, payload: bytes) -> None:
        try:
            self._sock.sendto(payload, socket.MSG_DONTWAIT, self._path)
        except OSError as exc:
            if exc.errno not in (errno.EMSGSIZE, errno.ENOBUFS):
                raise
            self._send_memfd(payload)

    def _send_memfd(self, payload: bytes) -> None:
        fd = os.memfd_create("ingero-journal", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.write(fd, payload)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            self._sock.sendmsg(
                [],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))],
                socket.MSG_DONTWAIT,
                self._path,
            )
        finally:
            os.close(fd)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def close(self) -> None:
        self._sock.close()

    def _count(self, key: str) -> None:
        with self._lock:
            self._counts[key] += 1
