"""The job's side of ``ingero annotate``: marks steps, phases and labels on the node's socket.

Pure standard library (a training job imports it without ingero's heavy dependencies), and
it never stops the job: no server, a full socket or a refused line costs the mark, counted
in ``dropped`` and ``refused``, never an exception or a blocked step.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Final

from ingero.annotate.codec import (
    DEFAULT_SOCKET,
    SOCKET_ENV,
    LabelValue,
    Mark,
    decode_refusal,
    encode_mark,
)

# Lines held while the server reads slower than the job writes; past this, marks are dropped
# (memory stays bounded and the step goes on).
MAX_PENDING_BYTES: Final = 64 * 1024
# After a failed connect, marks are dropped without trying again for this long: a job that
# marks every step on a node with no server pays no connect per step.
RECONNECT_S: Final = 1.0


def socket_path(path: str | os.PathLike[str] | None = None) -> str:
    """The socket a client connects to: ``path``, else $INGERO_ANNOTATE_SOCKET, else the
    server's default."""
    if path is not None:
        return os.fspath(path)
    return os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET


class Annotator:
    """One connection to the annotate socket, made on the first mark (and again after a
    failure, at most once per ``reconnect_s``)."""

    def __init__(
        self, path: str | os.PathLike[str] | None = None, reconnect_s: float = RECONNECT_S
    ) -> None:
        self.path = socket_path(path)
        self.reconnect_s = reconnect_s
        self._retry_at: float | None = None
        self.sent = 0  # lines handed to the socket
        self.dropped = 0  # marks lost: no server, or the socket full
        self.refused: list[tuple[str, str]] = []  # (reason, detail) the server answered
        self._sock: socket.socket | None = None
        self._pending = b""
        self._replies = b""

    def step(self, step: int | None = None, labels: Mapping[str, LabelValue] | None = None) -> None:
        """A step boundary: one step done (``step`` is the job's own number, where it has one)."""
        self.mark(Mark("step", "step", step=step, labels=dict(labels or {})))

    def phase(self, name: str, state: str, labels: Mapping[str, LabelValue] | None = None) -> None:
        """A phase begins or ends (``state``: begin | end)."""
        self.mark(Mark("phase", name, state=state, labels=dict(labels or {})))

    @contextmanager
    def span(self, name: str, labels: Mapping[str, LabelValue] | None = None) -> Iterator[None]:
        """The phase ``name`` around a block."""
        self.phase(name, "begin", labels)
        try:
            yield
        finally:
            self.phase(name, "end")

    def label(self, name: str, labels: Mapping[str, LabelValue]) -> None:
        """An instant mark carrying labels (a dataset shard, a learning rate, a config)."""
        self.mark(Mark("label", name, labels=dict(labels)))

    def mark(self, mark: Mark) -> None:
        line = encode_mark(mark)
        if len(self._pending) + len(line) > MAX_PENDING_BYTES:
            self.dropped += 1
            return
        self._pending += line
        self._flush()

    def read_refusals(self) -> list[tuple[str, str]]:
        """The refusals the server has written back so far (also kept in ``refused``)."""
        sock = self._sock
        if sock is None:
            return list(self.refused)
        while True:
            try:
                data = sock.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except OSError:
                self._reset()
                break
            if not data:
                self._reset()
                break
            self._replies += data
        *lines, self._replies = self._replies.split(b"\n")
        for line in lines:
            try:
                self.refused.append(decode_refusal(line))
            except ValueError:
                continue
        return list(self.refused)

    def close(self) -> None:
        self._flush()
        self._reset()

    def __enter__(self) -> Annotator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connect(self) -> socket.socket | None:
        if self._sock is None:
            if self._retry_at is not None and time.monotonic() < self._retry_at:
                return None
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.path)
            except OSError:
                sock.close()
                self._retry_at = time.monotonic() + self.reconnect_s
                return None
            self._retry_at = None
            sock.setblocking(False)
            self._sock = sock
        return self._sock

    def _flush(self) -> None:
        sock = self._connect()
        if sock is None:
            self.dropped += self._pending.count(b"\n")
            self._pending = b""
            return
        while self._pending:
            try:
                n = sock.send(self._pending)
            except BlockingIOError:
                return  # the server is behind: what is pending goes with the next mark
            except OSError:
                # The server went away (a restart): the next mark connects again.
                self.dropped += self._pending.count(b"\n")
                self._pending = b""
                self._reset()
                return
            self.sent += self._pending[:n].count(b"\n")
            self._pending = self._pending[n:]

    def _reset(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
