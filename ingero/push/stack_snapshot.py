"""One snapshot of the Python stacks of a job's processes on this node (``stack_snapshot``).

When the node is ``stalled``, or Fleet's push reply names one of its ranks in a
``collective_hang`` (a rank the others wait for) or a ``peer_lag`` episode, fleet-push takes
one snapshot of where the job's processes are in their code: the answer to "why does
everyone wait for rank 5" is the line rank 5 is on.

The dump is py-spy's (``py-spy dump --pid P --json --nonblocking``): a well-kept tool that
reads every CPython 3.x frame layout from outside the process. ``--nonblocking`` never
pauses the process, and reads a process frozen with SIGSTOP as well as a running one.
``native`` adds ``--native`` (C frames too); py-spy refuses it together with
``--nonblocking``, so it pauses each process for the few milliseconds of the dump.

Bounded in every direction: at most ``max_processes`` processes, each dump within
``timeout_s`` and ``max_output`` bytes of output (py-spy is killed past either), at most
``max_frames`` frames per thread (innermost kept) and ``max_bytes`` of stacks JSON in all,
so the event stays within the OTLP record limit (``ingero.otlp.limits.MAX_EVENT_BYTES``).
Whatever goes wrong (py-spy missing, a process that exits mid-dump, permission denied, a
timeout, output that is not py-spy's JSON) gives an entry with a ``reason`` and no frames,
never an exception: the push loop goes on.

:func:`parse_dump`, :func:`fit` and :class:`SnapshotPlan` are pure; :func:`dump` runs py-spy;
:class:`Snapshotter` takes one snapshot at a time on a thread of its own.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ingero.nodedb import processes, sidefile
from ingero.nodedb.schema import SchemaError, connect
from ingero.runtime.clock import Clock
from ingero.schema.events import Event
from ingero.schema.stacks import MAX_FRAMES, MAX_TEXT, Frame, Stack

log = logging.getLogger(__name__)

PY_SPY = "py-spy"
# Where a reason or an error line is cut: one line of a log or an event.
_REASON_CHARS = 200


@dataclass(frozen=True)
class Target:
    """A process of the job on this node, as the node DB's ``processes`` table tags it."""

    pid: int
    rank: int | None = None


@dataclass(frozen=True)
class ThreadStack:
    """One thread's stack in a snapshot (or a process's failure: no frames, a reason)."""

    pid: int
    rank: int | None
    stack: Stack
    thread: str | None = None  # the thread's name
    tid: int | None = None  # the OS thread id
    active: bool | None = None  # py-spy: the thread was running (not idle in a wait)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"pid": self.pid, "rank": self.rank}
        if self.thread is not None:
            d["thread"] = self.thread
        if self.tid is not None:
            d["tid"] = self.tid
        if self.active is not None:
            d["active"] = self.active
        d.update(self.stack.to_json())
        return d


def _cut(text: str, width: int = _REASON_CHARS) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _frame(raw: object) -> Frame:
    """A py-spy frame: a Python one has no ``module``; a native one names its library there
    and its symbol (or ``0x…``, the address, when it has none) in ``name``."""
    if not isinstance(raw, dict):
        raise ValueError("a frame is not an object")
    name, filename, module, line = (
        raw.get("name"),
        raw.get("filename"),
        raw.get("module"),
        raw.get("line"),
    )
    if not isinstance(name, str) or not isinstance(filename, str):
        raise ValueError("a frame has no name or filename")
    if module is None:
        if isinstance(line, bool) or not isinstance(line, int):
            raise ValueError("a Python frame has no line")
        # py-spy's line is the one being executed (from the frame's last instruction);
        # 0 is its "unknown".
        return Frame(
            "py", function=name[:MAX_TEXT], file=filename[:MAX_TEXT], line=line if line else None
        )
    if not isinstance(module, str):
        raise ValueError("a frame's module is not a string")
    if name.startswith("0x"):
        try:
            return Frame("native", lib=module[:MAX_TEXT], addr=int(name, 16))
        except ValueError:
            pass
    return Frame("native", function=name[:MAX_TEXT], lib=module[:MAX_TEXT])


def parse_dump(text: str, target: Target, max_frames: int = MAX_FRAMES) -> list[ThreadStack]:
    """py-spy's ``dump --json`` output of one process as one ThreadStack per thread; one
    entry with a reason when the text is not that output. ``max_frames`` (at most
    MAX_FRAMES) keeps the innermost frames of a deeper stack and says so."""
    cap = max(1, min(max_frames, MAX_FRAMES))
    try:
        threads = json.loads(text)
        if not isinstance(threads, list):
            raise ValueError("not a list of threads")
        out = []
        for t in threads:
            if not isinstance(t, dict) or not isinstance(t.get("frames"), list):
                raise ValueError("a thread without frames")
            raw = t["frames"]
            frames = tuple(_frame(f) for f in raw[:cap])
            reason = f"truncated at {cap} of {len(raw)} frames" if len(raw) > cap else None
            name, tid, active = t.get("thread_name"), t.get("os_thread_id"), t.get("active")
            out.append(
                ThreadStack(
                    pid=target.pid,
                    rank=target.rank,
                    stack=Stack(frames, reason),
                    thread=name[:MAX_TEXT] if isinstance(name, str) else None,
                    tid=tid if isinstance(tid, int) and not isinstance(tid, bool) else None,
                    active=active if isinstance(active, bool) else None,
                )
            )
    except (ValueError, TypeError, AttributeError) as exc:
        return [failed(target, f"py-spy output is not its JSON dump: {_cut(str(exc), 80)}")]
    return out


def failed(target: Target, reason: str) -> ThreadStack:
    return ThreadStack(target.pid, target.rank, Stack((), _cut(reason)))


def find_py_spy(configured: str = PY_SPY) -> str | None:
    """The py-spy executable: ``configured`` when a path, else on PATH, else beside this
    interpreter (the wheel installs it into the venv's bin, which a unit's PATH lacks)."""
    if os.sep in configured:
        return configured if os.access(configured, os.X_OK) else None
    found = shutil.which(configured)
    if found:
        return found
    beside = Path(sys.executable).parent / configured
    return str(beside) if os.access(beside, os.X_OK) else None


def _read_bounded(
    proc: subprocess.Popen[bytes], timeout_s: float, max_output: int
) -> tuple[bytes, bytes, str | None]:
    """stdout and stderr of ``proc`` until it exits; a reason (and the process killed)
    once it runs past ``timeout_s`` or writes more than ``max_output`` bytes."""
    assert proc.stdout is not None and proc.stderr is not None
    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + timeout_s
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    reason = None
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                reason = f"py-spy ran past {timeout_s:g} s"
                break
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf: bytearray = key.data
                if buf is out or len(err) < 4096:
                    buf += chunk
            if len(out) > max_output:
                reason = f"py-spy wrote more than {max_output} bytes"
                break
    finally:
        sel.close()
        if reason is not None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    return bytes(out), bytes(err), reason


PERMISSION_DENIED = (
    "py-spy: Permission denied (reading another user's process needs CAP_SYS_PTRACE)"
)


def _error_line(stderr: bytes, rc: int) -> str:
    """py-spy's own error (``Error: …``), without its backtrace. Its refusal to read another
    user's process is not an ``Error:`` line, and its advice (run it with sudo) does not
    fit a service: the reason says what the service lacks instead."""
    lines = stderr.decode(errors="replace").splitlines()
    for line in lines:
        if line.startswith("Error:"):
            return _cut("py-spy: " + line[len("Error:") :].strip())
    if any(line.lower().startswith("permission denied") for line in lines):
        return PERMISSION_DENIED
    return f"py-spy exited with status {rc}"


def dump(
    target: Target,
    *,
    py_spy: str | None,
    timeout_s: float = 2.0,
    max_output: int = 1 << 20,
    max_frames: int = MAX_FRAMES,
    native: bool = False,
) -> list[ThreadStack]:
    """The threads of one process, or one entry saying why there are none."""
    if py_spy is None:
        return [failed(target, "py-spy not found: no stack snapshot")]
    argv = [py_spy, "dump", "--pid", str(target.pid), "--json"]
    argv.append("--native" if native else "--nonblocking")
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "RUST_BACKTRACE": "0"},
        )
    except OSError as exc:
        return [failed(target, f"cannot run py-spy: {exc.strerror or exc}")]
    out, err, reason = _read_bounded(proc, timeout_s, max_output)
    if reason is not None:
        return [failed(target, reason)]
    if proc.returncode != 0:
        return [failed(target, _error_line(err, proc.returncode))]
    return parse_dump(out.decode(errors="replace"), target, max_frames)


def job_targets(
    db_path: Path,
    job_id: str | None,
    *,
    limit: int,
    pid_alive: Callable[[int], bool],
    timeout_s: float = 0.5,
) -> list[Target]:
    """The live processes of ``job_id`` (any job when None) in the node DB's ``processes``
    table, newest first, at most ``limit``; none when the DB cannot be read."""
    try:
        db = connect(db_path, readonly=True, timeout=timeout_s)
    except (sqlite3.Error, SchemaError, OSError) as exc:
        log.warning("%s: cannot read processes for a stack snapshot: %s", db_path, exc)
        return []
    try:
        rows = processes.job_ranks(db, job_id, 4 * limit)
    except sqlite3.Error as exc:
        log.warning("%s: cannot read processes for a stack snapshot: %s", db_path, exc)
        return []
    finally:
        db.conn.close()
    out = [Target(int(pid), None if rank is None else int(rank)) for pid, rank in rows]
    return [t for t in out if pid_alive(t.pid)][:limit]


def _shown_first(t: ThreadStack) -> tuple[bool, bool, bool]:
    """Sort key: threads with Python frames first, then running ones, then main threads."""
    return (not t.stack.python(), t.active is not True, t.tid != t.pid)


def _size(t: ThreadStack) -> int:
    return len(json.dumps(t.to_json(), separators=(",", ":"))) + 1


def _shrunk(t: ThreadStack, limit: int) -> ThreadStack:
    """``t`` with as many of its innermost frames as fit in ``limit`` bytes of JSON."""
    frames = t.stack.frames
    if _size(t) <= limit or not frames:
        return t
    lo, hi = 0, len(frames)  # lo frames fit; hi do not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        trial = replace(t, stack=Stack(frames[:mid], f"truncated at {mid} of {len(frames)} frames"))
        lo, hi = (mid, hi) if _size(trial) <= limit else (lo, mid)
    reason = f"truncated at {lo} of {len(frames)} frames"
    return replace(t, stack=Stack(frames[:lo], reason))


def fit(threads: Sequence[ThreadStack], max_bytes: int) -> tuple[list[ThreadStack], int]:
    """The threads kept within ``max_bytes`` of JSON, and how many were left out. Each
    process's most telling thread (Python frames, running, main: :func:`_shown_first`) comes
    first, round-robin over the processes, so one process with many threads cannot crowd
    the others out; a thread larger than a process's share keeps its innermost frames."""
    by_pid: dict[int, list[ThreadStack]] = {}
    for t in threads:
        by_pid.setdefault(t.pid, []).append(t)
    share = max_bytes // max(1, len(by_pid))
    queues = [deque(sorted(ts, key=_shown_first)) for ts in by_pid.values()]
    kept: list[ThreadStack] = []
    used, left_out = 2, 0
    while queues:
        for q in list(queues):
            t = _shrunk(q.popleft(), share)
            if not q:
                queues.remove(q)
            size = _size(t)
            if used + size <= max_bytes:
                kept.append(t)
                used += size
            else:
                left_out += 1
    return kept, left_out


@dataclass
class SnapshotPlan:
    """Which episodes get a snapshot: one per episode id (the first time it is seen while
    due), at most one snapshot per ``min_gap_s`` (a later episode waits for its turn and
    is taken then if still open). Pure: the caller passes the monotonic time."""

    min_gap_s: float
    remember: int = 64
    _taken: deque[str] = field(default_factory=deque)
    _last: float | None = None

    def due(self, episode_id: str, mono: float) -> bool:
        if not episode_id or episode_id in self._taken:
            return False
        return self._last is None or mono - self._last >= self.min_gap_s

    def taken(self, episode_id: str, mono: float) -> None:
        self._taken.append(episode_id)
        while len(self._taken) > self.remember:
            self._taken.popleft()
        self._last = mono


def snapshot(
    targets: Iterable[Target],
    dumper: Callable[[Target], list[ThreadStack]],
    max_bytes: int,
) -> tuple[list[ThreadStack], int]:
    """Every target dumped, fitted into ``max_bytes`` (see :func:`fit`)."""
    threads: list[ThreadStack] = []
    for target in targets:
        try:
            threads.extend(dumper(target))
        except Exception as exc:  # a bug in a dump must not cost the push loop
            log.exception("stack snapshot of pid %d failed", target.pid)
            threads.append(failed(target, f"snapshot failed: {type(exc).__name__}"))
    return fit(threads, max_bytes)


@dataclass(frozen=True)
class Request:
    """One snapshot to take: the episode it belongs to, and what the event says of it."""

    episode_id: str
    trigger: str  # stalled | collective_hang | peer_lag
    for_s: float  # how long the rank has been in that state when asked
    node_id: str
    cluster_id: str
    job_id: str | None
    rank: int | None
    op: str | None = None  # the collective the episode is about, when Fleet named one
    seq: int | None = None


class Snapshotter:
    """Takes snapshots on a thread of its own, one at a time, so a slow dump never holds
    up a push; :meth:`offer` is called every iteration and starts one when the plan says
    the episode is due and no snapshot is running (else the episode waits for the next
    iteration). ``emit`` gets the ``stack_snapshot`` event."""

    def __init__(
        self,
        *,
        targets: Callable[[str | None], list[Target]],
        dumper: Callable[[Target, float], list[ThreadStack]],
        emit: Callable[[Event], None],
        clock: Clock,
        min_gap_s: float,
        keep: Path | None = None,
        timeout_s: float,
        max_processes: int,
        max_bytes: int,
    ) -> None:
        self.targets = targets
        self.dumper = dumper
        self.emit = emit
        self.clock = clock
        self.plan = SnapshotPlan(min_gap_s)
        self.budget_s = timeout_s * max_processes
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.keep = keep  # the node DB beside which the newest snapshot is kept
        self._thread: threading.Thread | None = None
        self._empty: str | None = None  # the episode last found with no process to dump

    def offer(self, request: Request) -> bool:
        """Start the request's snapshot if due; True when started. An episode is taken only
        once the node DB lists a live process of the job (the tracer may not have written
        it yet): until then it stays due, and is offered again on the next push."""
        mono = self.clock.monotonic()
        if self._thread is not None and self._thread.is_alive():
            return False
        if not self.plan.due(request.episode_id, mono):
            return False
        targets = self.targets(request.job_id)
        if not targets:
            if request.episode_id != self._empty:
                log.info("stack snapshot waits: no live process of job %s", request.job_id)
                self._empty = request.episode_id
            return False
        self.plan.taken(request.episode_id, mono)
        self._thread = threading.Thread(
            target=self._take, args=(request, mono, targets), name="stack-snapshot", daemon=True
        )
        self._thread.start()
        return True

    def wait(self, timeout: float | None = None) -> None:
        """Until the running snapshot (if any) is sent (tests, shutdown)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _take(self, request: Request, asked: float, targets: list[Target]) -> None:
        try:
            event = self.take(request, asked, targets)
            self.emit(event)
            if self.keep is not None:
                try:
                    sidefile.write(self.keep, event.to_dict())
                except OSError as exc:
                    log.warning("cannot keep the stack snapshot beside %s: %s", self.keep, exc)
        except Exception:  # the thread's bug is logged; the agent goes on
            log.exception("stack snapshot of episode %s failed", request.episode_id)

    def take(self, request: Request, asked: float, targets: list[Target]) -> Event:
        """The snapshot's event (on the caller's thread)."""
        start = self.clock.monotonic()

        def bounded(target: Target) -> list[ThreadStack]:
            left = self.budget_s - (self.clock.monotonic() - start)
            if left <= 0:
                return [failed(target, f"snapshot time budget of {self.budget_s:g} s spent")]
            return self.dumper(target, min(self.timeout_s, left))

        kept, left_out = snapshot(targets, bounded, self.max_bytes)
        took = self.clock.monotonic() - start
        extra: dict[str, Any] = {
            "trigger": request.trigger,
            "for_s": round(request.for_s + (start - asked), 1),
            "processes": len(targets),
            "stacks": [t.to_json() for t in kept],
            "snapshot_ms": round(took * 1e3, 1),
        }
        if request.op is not None:
            extra["op"] = request.op
        if request.seq is not None:
            extra["seq"] = request.seq
        if left_out:
            extra["threads_left_out"] = left_out
        return Event(
            type="stack_snapshot",
            node_id=request.node_id,
            cluster_id=request.cluster_id,
            timestamp=self.clock.now(),
            event_id=request.episode_id,
            job_id=request.job_id,
            rank=request.rank,
            extra=extra,
        )
