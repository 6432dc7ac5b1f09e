"""The job's side of ``ingero annotate``: marks steps, phases and labels on the node's socket.

Pure standard library (a training job imports it without ingero's heavy dependencies), and
it never stops the job: no server, a server that stopped accepting (a full listen backlog:
the connect is non-blocking and fails at once), a full socket or a refused line costs the
mark, counted in ``dropped`` and ``refused``, never an exception or a blocked step.

What a training loop passes is taken as it means it (``coerce``), without importing NumPy
or torch: a step number is anything with ``__index__`` (int, ``np.int64``, an integer
tensor) or a whole float; a label value is a bool (``np.bool_`` too), an integer within 64
bits, a finite float (anything with ``__float__``: ``np.float32``, ``Fraction``,
``Decimal``), text, or else its ``str()`` (``nan``, ``inf``, an array); bytes are decoded as
UTF-8 with U+FFFD for what is not. Names, keys and values are cut to the server's default
bounds (``codec.DEFAULT_LIMITS``) and labels past the sixteenth dropped, so the mark lands.
A step number that is not one is left out (the step is still marked); a phase state other
than begin or end, an empty name, or a value whose ``str()`` raises drops the mark or label.
"""

from __future__ import annotations

import errno
import math
import operator
import os
import re
import socket
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Final, SupportsFloat, SupportsIndex, cast

from ingero.annotate.codec import (
    DEFAULT_LIMITS,
    DEFAULT_SOCKET,
    MAX_INT,
    MIN_INT,
    SOCKET_ENV,
    STATES,
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


_SURROGATE = re.compile("[\ud800-\udfff]")


def _cut(text: str, limit: int) -> str:
    """``text`` as valid Unicode (a lone surrogate becomes U+FFFD) of at most ``limit`` UTF-8
    bytes, cut at a character boundary."""
    data = _SURROGATE.sub("\ufffd", text).encode()
    # "ignore" drops only the character the cut split: the rest is valid UTF-8
    return data[:limit].decode("utf-8", "ignore") if len(data) > limit else data.decode()


def _text(value: object, limit: int) -> str | None:
    """A name, key or value as text; None when it has none (its ``str()`` raised)."""
    if isinstance(value, bytes | bytearray | memoryview):
        text = bytes(value).decode("utf-8", "replace")
    elif isinstance(value, str):
        text = value
    else:
        try:
            text = str(value)
        except Exception:
            return None
    return _cut(text, limit)


def _is_bool(value: object) -> bool:
    if isinstance(value, bool):
        return True
    # np.bool_ and torch's bool tensors: neither is an int, both name their dtype "bool"
    return str(getattr(value, "dtype", "")) in ("bool", "torch.bool")


def coerce_step(value: object) -> int | None:
    """The step number a loop passed, or None where it is not one."""
    if value is None or _is_bool(value):
        return None
    try:
        number = operator.index(cast(SupportsIndex, value))
    except Exception:
        try:
            real = float(cast(SupportsFloat, value))
        except Exception:
            return None
        if not math.isfinite(real) or not real.is_integer():
            return None
        number = int(real)
    return number if 0 <= number <= MAX_INT else None


def coerce_value(value: object) -> LabelValue | None:
    """A label value as the codec takes it (see the module's docstring); None: dropped."""
    limit = DEFAULT_LIMITS.max_value_bytes
    if isinstance(value, str | bytes | bytearray | memoryview):
        return _text(value, limit)
    try:
        if _is_bool(value):
            return bool(value)
        if hasattr(value, "__index__"):
            number = operator.index(cast(SupportsIndex, value))
            if MIN_INT <= number <= MAX_INT:
                return number
        elif hasattr(value, "__float__"):
            real = float(cast(SupportsFloat, value))
            if math.isfinite(real):
                return real
    except Exception:
        pass
    return _text(value, limit)


def coerce_labels(labels: object) -> dict[str, LabelValue]:
    """The labels a loop passed, as the codec takes them (bounded); {} when they are none."""
    if labels is None:
        return {}
    try:
        items = list(labels.items() if isinstance(labels, Mapping) else dict(labels).items())  # type: ignore[call-overload]
    except Exception:
        return {}
    out: dict[str, LabelValue] = {}
    for key, value in items:
        if len(out) >= DEFAULT_LIMITS.max_labels:
            break
        name = _text(key, DEFAULT_LIMITS.max_key_bytes)
        item = coerce_value(value)
        if name and item is not None:
            out[name] = item
    return out


def coerce_mark(mark: Mark) -> Mark | None:
    """``mark`` as the server takes it, or None (dropped) where it cannot be one."""
    kind = mark.kind if mark.kind in ("step", "phase", "label") else None
    if kind is None:
        return None
    name = "step" if kind == "step" else _text(mark.name, DEFAULT_LIMITS.max_name_bytes)
    if not name:
        return None
    state = None
    if kind == "phase":
        state = _text(mark.state, 8)
        if state not in STATES:
            return None
    ts = mark.ts
    if ts is not None:
        try:
            ts = float(ts)
        except Exception:
            ts = None
        if ts is not None and not math.isfinite(ts):
            ts = None
    return Mark(kind, name, coerce_step(mark.step), state, coerce_labels(mark.labels), ts)


def _line(mark: Mark) -> bytes:
    """The mark's line, labels dropped from the last until it fits the server's line bound."""
    line = encode_mark(mark)
    labels = dict(mark.labels)
    while len(line) - 1 > DEFAULT_LIMITS.max_line_bytes and labels:
        labels.popitem()
        line = encode_mark(Mark(mark.kind, mark.name, mark.step, mark.state, labels, mark.ts))
    return line


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
        self._mid_line = False  # part of the first pending line is already sent
        self._replies = b""

    def step(self, step: object = None, labels: object = None) -> None:
        """A step boundary: one step done (``step`` is the job's own number, where it has one)."""
        self.mark(Mark("step", "step", step=step, labels=labels))  # type: ignore[arg-type]

    def phase(self, name: object, state: str, labels: object = None) -> None:
        """A phase begins or ends (``state``: begin | end)."""
        self.mark(Mark("phase", name, state=state, labels=labels))  # type: ignore[arg-type]

    @contextmanager
    def span(self, name: object, labels: object = None) -> Iterator[None]:
        """The phase ``name`` around a block."""
        self.phase(name, "begin", labels)
        try:
            yield
        finally:
            self.phase(name, "end")

    def label(self, name: object, labels: object) -> None:
        """An instant mark carrying labels (a dataset shard, a learning rate, a config)."""
        self.mark(Mark("label", name, labels=labels))  # type: ignore[arg-type]

    def mark(self, mark: Mark) -> None:
        """Send ``mark`` (coerced, see the module); never raises, never blocks."""
        try:
            taken = coerce_mark(mark)
            if taken is None:
                self.dropped += 1
                return
            line = _line(taken)
            if len(self._pending) + len(line) > MAX_PENDING_BYTES:
                self.dropped += 1
                return
            self._pending += line
            self._flush()
        except Exception:  # a bug here must cost the mark, not the training step
            self.dropped += 1

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
            # Non-blocking from the start: a server whose listen backlog is full (stopped,
            # busy, in a frozen cgroup) answers EAGAIN at once instead of holding the step.
            sock.setblocking(False)
            try:
                code = sock.connect_ex(self.path)
            except (OSError, ValueError):
                code = errno.EINVAL
            if code != 0:
                sock.close()
                self._retry_at = time.monotonic() + self.reconnect_s
                return None
            self._retry_at = None
            self._sock = sock
        return self._sock

    def _flush(self, again: bool = True) -> None:
        sock = self._connect()
        if sock is None:
            self.dropped += self._pending.count(b"\n")
            self._pending = b""
            self._mid_line = False
            return
        while self._pending:
            try:
                # MSG_NOSIGNAL: a closed server is EPIPE here, never a SIGPIPE for the job
                n = sock.send(self._pending, socket.MSG_NOSIGNAL)
            except BlockingIOError:
                return  # the server is behind: what is pending goes with the next mark
            except OSError:
                # The server closed this connection (a restart, an idle close): connect
                # once more now and send what is pending there, less a line begun here.
                self._reset()
                if self._mid_line:
                    self._pending = self._pending.partition(b"\n")[2]
                    self.dropped += 1
                    self._mid_line = False
                if again and self._pending:
                    self._flush(again=False)
                    return
                self.dropped += self._pending.count(b"\n")
                self._pending = b""
                return
            if n > 0:
                self.sent += self._pending[:n].count(b"\n")
                self._mid_line = self._pending[n - 1 : n] != b"\n"
                self._pending = self._pending[n:]

    def _reset(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
