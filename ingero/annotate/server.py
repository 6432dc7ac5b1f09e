"""The annotate server: a local Unix socket where jobs write mark lines (``codec``).

``Annotations`` is the pure core (clock injected): it takes each connection's bytes with
the writer's identity from SO_PEERCRED (the kernel's word, never a pid in the line), splits
lines, decodes and bounds them, and hands back node DB rows at each ``take``. Everything it
holds is bounded by ``ServerLimits``: clients (in all and per uid), the partial line per
client, the refusals waiting to be written back, the open phases per writer, and the rate
buckets, one per process (its pid and start time: a recycled pid is a new one) and one per
uid, kept past the connection (a writer that reconnects draws on the same buckets, one that
forks a new pid on its uid's) and forgotten least recently used first.
``serve`` is the thin socket loop around it.

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
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Generic, TypeVar

from ingero.annotate.codec import LineError, Mark, decode_line, encode_refusal
from ingero.annotate.limits import DRAIN_S, ServerLimits
from ingero.nodedb.schema import ANNOTATE_SOURCE
from ingero.runtime.clock import Clock

# Refusal bytes held for a client that does not read them; beyond, refusals are only counted.
MAX_REPLY_BYTES: Final = 16 * 1024
# Bytes read from one connection at a time: with the partial line, what a client's buffer
# holds at most (max_line_bytes + READ_BYTES).
READ_BYTES: Final = 65536


# One process: its pid and its start (clock ticks after boot), as a pid is recycled.
ProcessKey = tuple[int, int | None]


@dataclass(frozen=True)
class Writer:
    pid: int
    uid: int
    job_id: str | None = None
    rank: int | None = None
    # The process's start, clock ticks after boot (/proc/PID/stat; None: unknown). A pid
    # recycled for a new process is a new writer: it inherits neither the old one's
    # bucket nor its open phases.
    started: int | None = None

    @property
    def process(self) -> ProcessKey:
        return (self.pid, self.started)


class TokenBucket:
    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self.at = now

    def ready(self, now: float) -> bool:
        """Refill to ``now``; whether a line may be taken."""
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.at) * self.rate)
        self.at = max(self.at, now)
        return self.tokens >= 1.0

    def take(self, now: float) -> bool:
        if self.ready(now):
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
    active_at: float  # monotonic: the last bytes read
    buf: bytes = b""
    line_since: float | None = None  # monotonic: when the partial line in buf began
    discarding: bool = False  # inside a line already refused as too long
    replies: bytes = b""


@dataclass
class _WriterState:
    """One pid's bucket and open phases; kept after its connections close (bounded)."""

    bucket: TokenBucket
    open_phases: dict[str, float] = field(default_factory=dict)  # name -> ts_start


K = TypeVar("K")
V = TypeVar("V")


class _Lru(Generic[K, V]):
    """At most ``size`` entries; the least recently used goes first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K, make: Callable[[], V]) -> V:
        item = self._items.get(key)
        if item is None:
            item = self._items[key] = make()
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        else:
            self._items.move_to_end(key)
        return item

    def __len__(self) -> int:
        return len(self._items)


class Annotations:
    def __init__(self, clock: Clock, limits: ServerLimits | None = None) -> None:
        self.clock = clock
        self.limits = limits = limits or ServerLimits()
        self.accepted = 0
        self.refused: Counter[str] = Counter()
        self.replies_dropped = 0
        self.last_refusal = b""  # the answer to the last connection ``open`` turned away
        self._conns: dict[int, _Conn] = {}
        self._per_uid: Counter[int] = Counter()
        self._writers: _Lru[ProcessKey, _WriterState] = _Lru(limits.max_writers)
        self._uids: _Lru[int, TokenBucket] = _Lru(limits.max_writers)
        self._take = Take()
        # Open phase rows not yet written, and step counts, per process.
        self._pending: dict[tuple[ProcessKey, str], dict[str, object]] = {}
        self._steps: dict[ProcessKey, tuple[Writer, int]] = {}
        self._since = clock.now()

    @property
    def clients(self) -> int:
        return len(self._conns)

    @property
    def writers(self) -> int:
        """Processes whose bucket is remembered (at most ``max_writers``)."""
        return len(self._writers)

    def open(self, conn: int, writer: Writer) -> bool:
        """A new connection; False when over the client count, in all or for the writer's
        uid (counted; ``last_refusal`` is then the line to answer)."""
        limits = self.limits
        if len(self._conns) >= limits.max_clients:
            detail = f"at most {limits.max_clients} clients"
        elif self._per_uid[writer.uid] >= limits.max_clients_per_uid:
            detail = f"at most {limits.max_clients_per_uid} clients per uid (uid {writer.uid})"
        else:
            self._conns[conn] = _Conn(writer, self.clock.monotonic())
            self._per_uid[writer.uid] += 1
            self._writer(writer)
            return True
        self.refused["clients"] += 1
        self.last_refusal = encode_refusal("clients", detail)
        return False

    def close(self, conn: int) -> None:
        """The connection ended; a partial last line is dropped. A writer's phases still open
        stay open in the node DB (``ts_end`` NULL): the job ended or died inside them. Its
        buckets stay, so a writer that reconnects finds them as it left them."""
        state = self._conns.pop(conn, None)
        if state is None:
            return
        uid = state.writer.uid
        self._per_uid[uid] -= 1
        if self._per_uid[uid] <= 0:
            del self._per_uid[uid]

    def feed(self, conn: int, data: bytes) -> None:
        """Bytes read from ``conn``; refusals queue for ``replies``."""
        state = self._conns[conn]
        now = self.clock.monotonic()
        state.active_at = now
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
                if state.buf or state.discarding:
                    if state.line_since is None:
                        state.line_since = now
                else:
                    state.line_since = None
                return
            state.buf = rest
            state.line_since = None
            if state.discarding:
                state.discarding = False
                continue
            if line.strip():
                try:
                    self._line(state, line)
                except Exception as exc:  # one line never stops the server: answered, counted
                    self._refuse(
                        state, "internal", f"the server failed on this line: {exc!r}"[:200]
                    )

    def expire(self) -> list[int]:
        """Connections silent for ``idle_s`` or inside one line for ``line_timeout_s``: each
        gets an ``idle`` refusal (counted) and is to be closed by the caller."""
        now = self.clock.monotonic()
        limits = self.limits
        out = []
        for conn, state in self._conns.items():
            if state.line_since is not None and now - state.line_since >= limits.line_timeout_s:
                detail = f"inside one line for over {limits.line_timeout_s:g} s"
            elif now - state.active_at >= limits.idle_s:
                detail = f"silent for over {limits.idle_s:g} s"
            else:
                continue
            self._refuse(state, "idle", detail)
            out.append(conn)
        return out

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
                    "uid": writer.uid,
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

    def _writer(self, writer: Writer) -> _WriterState:
        limits = self.limits
        return self._writers.get(
            writer.process,
            lambda: _WriterState(
                TokenBucket(limits.lines_per_s, limits.burst, self.clock.monotonic())
            ),
        )

    def _refuse(self, state: _Conn, reason: str, detail: str) -> None:
        self.refused[reason] += 1
        line = encode_refusal(reason, detail)
        if len(state.replies) + len(line) > MAX_REPLY_BYTES:
            self.replies_dropped += 1
            return
        state.replies += line

    def _rate(self, state: _Conn, ws: _WriterState) -> bool:
        """Take a line from the pid's and the uid's buckets; False (refused) when either is
        empty (neither is then charged)."""
        writer, limits = state.writer, self.limits
        now = self.clock.monotonic()
        uid = self._uids.get(
            writer.uid, lambda: TokenBucket(limits.uid_lines_per_s, limits.uid_burst, now)
        )
        if not ws.bucket.ready(now):
            self._refuse(
                state, "rate", f"over {limits.lines_per_s:g} lines per second for pid {writer.pid}"
            )
            return False
        if not uid.ready(now):
            rate = limits.uid_lines_per_s
            self._refuse(state, "rate", f"over {rate:g} lines per second for uid {writer.uid}")
            return False
        ws.bucket.take(now)
        uid.take(now)
        return True

    def _line(self, state: _Conn, line: bytes) -> None:
        writer = state.writer
        ws = self._writer(writer)
        if not self._rate(state, ws):
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
            self._pending[(writer.process, mark.name)] = row
        if mark.kind == "step":
            known = self._steps.get(writer.process)
            self._steps[writer.process] = (writer, (known[1] if known else 0) + 1)

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
        row = self._pending.pop((state.writer.process, mark.name), None)
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
    drain_s: float = DRAIN_S,
) -> None:
    """Accept, read and flush until ``stop``; one thread, non-blocking sockets. Once asked
    to stop, what writers sent is read for at most ``drain_s`` more, then flushed."""
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    conns: dict[int, socket.socket] = {}
    clock = core.clock
    next_flush = clock.monotonic() + flush_s

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
        except OSError:  # out of descriptors (EMFILE), say: the connection waits its turn
            return False
        try:
            pid, uid, _gid = peer_credentials(conn)
            writer = identify(pid, uid)
        except OSError:  # gone before it could be identified
            conn.close()
            return True
        if not core.open(conn.fileno(), writer):
            with contextlib.suppress(OSError):
                conn.setblocking(False)
                conn.send(core.last_refusal)
            conn.close()
            return True
        conn.setblocking(False)
        conns[conn.fileno()] = conn
        sel.register(conn, selectors.EVENT_READ)
        return True

    def read(fd: int) -> bool:
        """Read what one connection sent; False when nothing was waiting or it closed."""
        try:
            data = conns[fd].recv(READ_BYTES)
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

    def expire() -> None:
        for fd in core.expire():
            if fd in conns:
                write_back(fd)
                drop(fd)

    try:
        while not stop.is_set():
            timeout = max(0.0, min(0.1, next_flush - clock.monotonic()))
            for key, _ in sel.select(timeout):
                if key.fileobj is sock:
                    accept()
                elif key.fd in conns:
                    read(key.fd)
            expire()
            if clock.monotonic() >= next_flush:
                next_flush = clock.monotonic() + flush_s
                sink(core.take())
        # Asked to stop: what writers sent before it (a connection not yet accepted, bytes
        # not yet read) is read first, one read per connection in turn, until none has more
        # or the deadline passes; what was read by then is flushed below.
        deadline = clock.monotonic() + drain_s
        while clock.monotonic() < deadline and accept():
            pass
        busy = True
        while busy and clock.monotonic() < deadline:
            busy = False
            for fd in list(conns):
                if fd in conns and read(fd):
                    busy = True
    finally:
        sink(core.take())
        for fd in list(conns):
            drop(fd)
        sel.close()


def log_counts(core: Annotations) -> None:
    """What the server took and refused, on stderr as it stops."""
    line = f"ingero annotate: accepted {core.accepted} marks"
    if core.refused:
        counts = ", ".join(f"{n} {reason}" for reason, n in sorted(core.refused.items()))
        line += f"; refused {counts}"
    print(line, file=sys.stderr)
