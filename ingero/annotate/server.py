"""The annotate server: a local Unix socket where jobs write mark lines (``codec``).

``Annotations`` is the pure core (clock injected): it takes each connection's bytes with
the writer's identity from SO_PEERCRED (the kernel's word, never a pid in the line), splits
lines, decodes and bounds them, and hands back node DB rows at each ``take``. Everything it
holds is bounded: clients, the partial line per client, the refusals waiting to be written
back, the open phases per writer. ``serve`` is the thin socket loop around it.

Marked steps become ``intervals`` rows with ``op`` "step" (source "annotate"): one per
writer and flush, its count the steps marked, which is the step row detection reads.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import selectors
import socket
import stat
import struct
import sys
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from ingero.annotate.codec import (
    DEFAULT_LIMITS,
    Limits,
    LineError,
    Mark,
    decode_line,
    encode_refusal,
)
from ingero.nodedb.schema import ANNOTATE_SOURCE
from ingero.runtime.clock import Clock

# Refusal bytes held for a client that does not read them; beyond, refusals are only counted.
MAX_REPLY_BYTES: Final = 16 * 1024


@dataclass(frozen=True)
class ServerLimits:
    lines_per_s: float = 100.0  # per writer (pid), a token bucket ...
    burst: int = 200  # ... holding this many lines
    max_clients: int = 64
    max_open_phases: int = 16  # per writer
    line: Limits = DEFAULT_LIMITS


@dataclass(frozen=True)
class Writer:
    pid: int
    uid: int
    job_id: str | None = None
    rank: int | None = None


class TokenBucket:
    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self.at = now

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass
class Take:
    """What one flush writes: new marks, phase ends of marks already written, step rows."""

    marks: list[dict[str, object]] = field(default_factory=list)
    mark_ends: list[dict[str, object]] = field(default_factory=list)
    steps: list[dict[str, object]] = field(default_factory=list)


@dataclass
class _Conn:
    writer: Writer
    buf: bytes = b""
    discarding: bool = False  # inside a line already refused as too long
    replies: bytes = b""


@dataclass
class _WriterState:
    bucket: TokenBucket
    conns: int = 0
    open_phases: dict[str, float] = field(default_factory=dict)  # name -> ts_start


class Annotations:
    def __init__(self, clock: Clock, limits: ServerLimits = ServerLimits()) -> None:
        self.clock = clock
        self.limits = limits
        self.accepted = 0
        self.refused: Counter[str] = Counter()
        self.replies_dropped = 0
        self._conns: dict[int, _Conn] = {}
        self._writers: dict[int, _WriterState] = {}
        self._take = Take()
        self._pending: dict[tuple[int, str], dict[str, object]] = {}  # open phase rows unwritten
        self._steps: dict[int, tuple[Writer, int]] = {}
        self._since = clock.now()

    @property
    def clients(self) -> int:
        return len(self._conns)

    def open(self, conn: int, writer: Writer) -> bool:
        """A new connection; False (a refusal queued, counted) when over the client count."""
        if len(self._conns) >= self.limits.max_clients:
            self.refused["clients"] += 1
            return False
        self._conns[conn] = _Conn(writer)
        state = self._writers.get(writer.pid)
        if state is None:
            bucket = TokenBucket(self.limits.lines_per_s, self.limits.burst, self.clock.monotonic())
            state = self._writers[writer.pid] = _WriterState(bucket)
        state.conns += 1
        return True

    def refusal_for_clients(self) -> bytes:
        return encode_refusal("clients", f"at most {self.limits.max_clients} clients")

    def close(self, conn: int) -> None:
        """The connection ended; a partial last line is dropped. A writer's phases still open
        stay open in the node DB (``ts_end`` NULL): the job ended or died inside them."""
        state = self._conns.pop(conn, None)
        if state is None:
            return
        writer = self._writers.get(state.writer.pid)
        if writer is not None:
            writer.conns -= 1
            if writer.conns <= 0:
                del self._writers[state.writer.pid]

    def feed(self, conn: int, data: bytes) -> None:
        """Bytes read from ``conn``; refusals queue for ``replies``."""
        state = self._conns[conn]
        max_line = self.limits.line.max_line_bytes
        state.buf += data
        while True:
            line, sep, rest = state.buf.partition(b"\n")
            if not sep:
                if len(state.buf) > max_line:
                    # Bounded: a line that cannot fit is refused once and skipped to its end.
                    if not state.discarding:
                        self._refuse(state, "too_long", f"line longer than {max_line} bytes")
                    state.discarding = True
                    state.buf = b""
                return
            state.buf = rest
            if state.discarding:
                state.discarding = False
                continue
            if line.strip():
                self._line(state, line)

    def replies(self, conn: int) -> bytes:
        """Refusal lines waiting to be written to ``conn`` (taken)."""
        state = self._conns.get(conn)
        if state is None:
            return b""
        out, state.replies = state.replies, b""
        return out

    def unsent(self, conn: int, data: bytes) -> None:
        """Reply bytes the socket did not take: written next time (bounded)."""
        state = self._conns.get(conn)
        if state is not None:
            state.replies = (data + state.replies)[:MAX_REPLY_BYTES]

    def take(self) -> Take:
        """The rows since the last take: marks, phase ends, one step row per writer."""
        now = self.clock.now()
        out, self._take = self._take, Take()
        for writer, count in self._steps.values():
            out.steps.append(
                {
                    "ts_start": self._since,
                    "ts_end": max(now, self._since),
                    "pid": writer.pid,
                    "job_id": writer.job_id,
                    "rank": writer.rank,
                    "source": ANNOTATE_SOURCE,
                    "op": "step",
                    "count": count,
                    "total_ns": 0,
                }
            )
        self._steps.clear()
        self._pending.clear()
        self._since = now
        return out

    def _refuse(self, state: _Conn, reason: str, detail: str) -> None:
        self.refused[reason] += 1
        line = encode_refusal(reason, detail)
        if len(state.replies) + len(line) > MAX_REPLY_BYTES:
            self.replies_dropped += 1
            return
        state.replies += line

    def _line(self, state: _Conn, line: bytes) -> None:
        writer = state.writer
        ws = self._writers[writer.pid]
        if not ws.bucket.take(self.clock.monotonic()):
            rate = self.limits.lines_per_s
            self._refuse(state, "rate", f"over {rate:g} lines per second for pid {writer.pid}")
            return
        try:
            mark = decode_line(line, self.limits.line)
        except LineError as exc:
            self._refuse(state, exc.reason, exc.detail)
            return
        now = self.clock.now()
        ts = now
        if mark.ts is not None:
            skew = self.limits.line.max_clock_skew_s
            if abs(mark.ts - now) > skew:
                self._refuse(state, "clock", f"ts {mark.ts:.3f} is over {skew:g} s from {now:.3f}")
                return
            ts = mark.ts
        if mark.kind == "phase" and not self._phase(state, ws, mark, ts):
            return
        self.accepted += 1
        if mark.kind == "phase" and mark.state == "end":
            return
        row = self._row(writer, mark, ts)
        self._take.marks.append(row)
        if mark.kind == "phase":
            self._pending[(writer.pid, mark.name)] = row
        if mark.kind == "step":
            known = self._steps.get(writer.pid)
            self._steps[writer.pid] = (writer, (known[1] if known else 0) + 1)

    def _phase(self, state: _Conn, ws: _WriterState, mark: Mark, ts: float) -> bool:
        """Track a phase's begin or end; False (refused) when it does not pair."""
        pid = state.writer.pid
        if mark.state == "begin":
            if mark.name in ws.open_phases:
                self._refuse(state, "phase", f"phase {mark.name!r} is already open")
                return False
            if len(ws.open_phases) >= self.limits.max_open_phases:
                limit = self.limits.max_open_phases
                self._refuse(state, "phase", f"at most {limit} phases open at once")
                return False
            ws.open_phases[mark.name] = ts
            return True
        begun = ws.open_phases.pop(mark.name, None)
        if begun is None:
            self._refuse(state, "phase", f"phase {mark.name!r} ends but never began")
            return False
        ts = max(ts, begun)
        row = self._pending.pop((pid, mark.name), None)
        if row is not None:
            row["ts_end"] = ts
        else:
            self._take.mark_ends.append(
                {"pid": pid, "name": mark.name, "ts_start": begun, "ts_end": ts}
            )
        return True

    @staticmethod
    def _row(writer: Writer, mark: Mark, ts: float) -> dict[str, object]:
        return {
            "ts_start": ts,
            "ts_end": None,
            "pid": writer.pid,
            "uid": writer.uid,
            "job_id": writer.job_id,
            "rank": writer.rank,
            "kind": mark.kind,
            "name": mark.name,
            "step": mark.step,
            "labels": json.dumps(mark.labels, sort_keys=True) if mark.labels else None,
        }


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end, as the kernel recorded at connect."""
    fmt = "3i"
    data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize(fmt))
    pid, uid, gid = struct.unpack(fmt, data)
    return pid, uid, gid


def listen(path: Path, group: str | None = None) -> socket.socket:
    """Bind the socket: owner-only (0600), or 0660 owned by ``group`` when one is given.

    Created under a umask that leaves no window where others could connect; a stale socket
    left by a server that died is replaced, any other file at the path is an error."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise FileExistsError(f"{path} exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()
        else:
            raise FileExistsError(f"{path}: another annotate server is listening")
        finally:
            probe.close()
    gid = grp.getgrnam(group).gr_gid if group is not None else None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    if gid is not None:
        os.chown(path, -1, gid)
        os.chmod(path, 0o660)
    sock.listen(128)
    sock.setblocking(False)
    return sock


def serve(
    sock: socket.socket,
    core: Annotations,
    sink: Callable[[Take], None],
    stop: threading.Event,
    flush_s: float = 1.0,
    identify: Callable[[int, int], Writer] = lambda pid, uid: Writer(pid, uid),
) -> None:
    """Accept, read and flush until ``stop``; one thread, non-blocking sockets."""
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    conns: dict[int, socket.socket] = {}
    next_flush = core.clock.monotonic() + flush_s

    def drop(fd: int) -> None:
        conn = conns.pop(fd)
        sel.unregister(conn)
        core.close(fd)
        conn.close()

    def write_back(fd: int) -> None:
        out = core.replies(fd)
        if not out:
            return
        try:
            n = conns[fd].send(out)
        except BlockingIOError:
            n = 0
        except OSError:
            return
        if n < len(out):
            core.unsent(fd, out[n:])

    def accept() -> bool:
        """Accept one pending connection; False when none was pending."""
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return False
        try:
            pid, uid, _gid = peer_credentials(conn)
            writer = identify(pid, uid)
        except OSError:  # gone before it could be identified
            conn.close()
            return True
        if not core.open(conn.fileno(), writer):
            with contextlib.suppress(OSError):
                conn.send(core.refusal_for_clients())
            conn.close()
            return True
        conn.setblocking(False)
        conns[conn.fileno()] = conn
        sel.register(conn, selectors.EVENT_READ)
        return True

    def read(fd: int) -> bool:
        """Read what one connection sent; False when nothing was waiting or it closed."""
        try:
            data = conns[fd].recv(65536)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            write_back(fd)
            drop(fd)
            return False
        core.feed(fd, data)
        write_back(fd)
        return True

    try:
        while not stop.is_set():
            timeout = max(0.0, min(0.1, next_flush - core.clock.monotonic()))
            for key, _ in sel.select(timeout):
                if key.fileobj is sock:
                    accept()
                elif key.fd in conns:
                    read(key.fd)
            if core.clock.monotonic() >= next_flush:
                next_flush = core.clock.monotonic() + flush_s
                sink(core.take())
        # Asked to stop: what writers sent before it (a connection not yet accepted, bytes
        # not yet read) is read first, so no mark sent before the stop is lost.
        while accept():
            pass
        for fd in list(conns):
            while fd in conns and read(fd):
                pass
    finally:
        sink(core.take())
        for fd in list(conns):
            drop(fd)
        sel.close()


def log_refusals(core: Annotations) -> None:
    if core.refused:
        counts = ", ".join(f"{n} {reason}" for reason, n in sorted(core.refused.items()))
        print(f"ingero annotate: refused {counts}", file=sys.stderr)
