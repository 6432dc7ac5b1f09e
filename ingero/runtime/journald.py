"""The one writer of ingero's journal entries: journald's native protocol, by hand.

Every daemon's events (fleet-push's channel, Fleet's event exit point, the Slurm epilog and
its problem reports) are written here, so each entry carries the same structured fields
(``Event.journal_fields()``: MESSAGE, MESSAGE_ID, PRIORITY, INGERO_*). A leaf module,
standard library only: Fleet may not import the node side, and the Slurm hooks must start
fast; a libsystemd binding would be a compiled dependency for one datagram.

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
from collections.abc import Mapping

from ingero.runtime.systemd import JOURNAL_SOCKET
from ingero.schema.events import Event

log = logging.getLogger(__name__)

_NAME_RE = re.compile(r"^[A-Z0-9][A-Z0-9_]{0,63}$")
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL


def encode_fields(fields: Mapping[str, str]) -> bytes:
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


def stderr_is_journal() -> bool:
    """Whether this process's stderr is a journald stream (systemd sets ``$JOURNAL_STREAM``
    to its ``device:inode``), so a line printed there would duplicate a native entry."""
    stream = os.environ.get("JOURNAL_STREAM", "")
    device, _, inode = stream.partition(":")
    if not (device.isdigit() and inode.isdigit()):
        return False
    try:
        st = os.fstat(2)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (int(device), int(inode))


class JournalWriter:
    """Writes entries to journald; never blocks and never raises (outcomes are counted)."""

    def __init__(self, path: str = JOURNAL_SOCKET) -> None:
        self._path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._lock = threading.Lock()
        self._counts = {"sent": 0, "dropped": 0, "errors": 0}

    def write(self, fields: Mapping[str, str]) -> bool:
        """Send one entry; False when it did not reach journald (absent, full, refusing)."""
        try:
            self._send(encode_fields(fields))
        except BlockingIOError:
            self._count("dropped")
            return False
        except (OSError, ValueError) as exc:
            # journald absent or refusing: counted; the caller goes on.
            self._count("errors")
            log.debug("journald: %s", exc)
            return False
        self._count("sent")
        return True

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


class EventJournal:
    """Events to journald through one writer: MESSAGE_ID, PRIORITY and INGERO_* fields
    (``Event.journal_fields``), so ``journalctl MESSAGE_ID=…``, ``-p warning`` and
    ``ingero events`` find fleet-push's and Fleet's events alike. Never blocks or raises."""

    def __init__(self, path: str = JOURNAL_SOCKET) -> None:
        self._writer = JournalWriter(path)

    def write(self, event: Event) -> bool:
        """False when the entry did not reach journald (absent, full, refusing)."""
        return self._writer.write(event.journal_fields())

    def stats(self) -> dict[str, int]:
        return self._writer.stats()

    def close(self) -> None:
        self._writer.close()


def journal_send(fields: Mapping[str, str], path: str = JOURNAL_SOCKET) -> bool:
    """One entry from a short-lived process (the Slurm hooks); False when it was not written."""
    writer = JournalWriter(path)
    try:
        return writer.write(fields)
    finally:
        writer.close()
