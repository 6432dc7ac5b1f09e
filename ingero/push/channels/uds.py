"""Events as NDJSON (one JSON object per line) to a Unix stream socket, e.g. ``ingero sink``."""

from __future__ import annotations

import socket

from ingero.push.channels.queued import QueuedChannel
from ingero.schema.events import Event


class UdsChannel(QueuedChannel):
    """Connects lazily and reconnects after a failure; queued events wait for the consumer."""

    name = "uds"

    def __init__(self, path: str, queue_size: int = 1000, send_timeout: float = 1.0) -> None:
        self._path = path
        self._send_timeout = send_timeout
        self._sock: socket.socket | None = None
        super().__init__(queue_size)

    def _deliver(self, event: Event) -> None:
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            # A stalled consumer blocks only this thread, and only for the timeout.
            sock.settimeout(self._send_timeout)
            try:
                sock.connect(self._path)
            except OSError:
                sock.close()
                raise
            self._sock = sock
        self._sock.sendall(event.to_json().encode() + b"\n")

    def _reset(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
