"""Slurm through pyslurm (Slurm's own C library), held in a child process.

:class:`PyslurmBackend` keeps the :class:`~ingero.slurm.backend.SlurmBackend` contract of the
scontrol backend (same node states, same ``SlurmError`` one-line errors and exit code) and
adds job lookups, without a process per call: one worker
(:mod:`ingero.slurm.pyslurm_worker`) lives as long as the backend and answers over a pipe.
The worker is started on the first call and again after it died or timed out, so a missing
slurm.conf (libslurm exits), a pyslurm of the wrong release or a frozen slurmctld is one
failed call (the daemon retries it) and never the daemon's end.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import selectors
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from importlib.util import find_spec
from typing import IO, Any

from ingero.slurm.backend import (
    DEFAULT_TIMEOUT,
    JobRecord,
    NodeInfo,
    SlurmError,
    check_admin_comment,
    check_node_name,
    check_reason,
    node_from_state,
)
from ingero.slurm.jobfile import check_job_id

# Lines of the worker's stderr kept for the error message when it dies (libslurm's "fatal:").
_STDERR_LINES = 20
_SLURM_VERSION = re.compile(r"\b(\d+)\.(\d+)(?:\.\d+)?")


def pyslurm_installed() -> bool:
    """pyslurm can be found by this interpreter (checked without importing it)."""
    return find_spec("pyslurm") is not None


def release(version: str) -> str | None:
    """The Slurm release ``major.minor`` in a version string ("slurm 25.11.7" -> "25.11")."""
    match = _SLURM_VERSION.search(version)
    return f"{match[1]}.{match[2]}" if match else None


class _Worker:
    """One running worker: its process, the pipe's reader, and the tail of its stderr."""

    def __init__(self, argv: list[str], env: dict[str, str] | None) -> None:
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            close_fds=True,
        )
        assert self.proc.stdin and self.proc.stdout and self.proc.stderr
        self.stdin: IO[bytes] = self.proc.stdin
        self.stdout: IO[bytes] = self.proc.stdout
        self._buffer = b""
        self.eof = False  # the worker closed its end (it died), as opposed to a timeout
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=_STDERR_LINES)
        # Drained on its own thread, so a chatty libslurm can never fill the pipe and block.
        self._drain = threading.Thread(
            target=self._read_stderr, args=(self.proc.stderr,), daemon=True
        )
        self._drain.start()

    def _read_stderr(self, stream: IO[bytes]) -> None:
        for raw in stream:
            line = raw.decode("utf-8", "replace").strip()
            if line:
                self.stderr_tail.append(line)

    def read_line(self, deadline: float) -> bytes | None:
        """The next line from the worker; None at the deadline or at its end."""
        with selectors.DefaultSelector() as sel:
            sel.register(self.stdout, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return None
                # os.read, not the buffered reader: after select it returns what is there
                # (b"" only at the worker's end) and never waits for more.
                chunk = os.read(self.stdout.fileno(), 65536)
                if not chunk:
                    self.eof = True
                    return None
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def last_words(self) -> str:
        """Why the worker ended, from its exit status and the last line it printed."""
        try:
            code = self.proc.wait(2)
        except subprocess.TimeoutExpired:
            code = None
        self._drain.join(1)
        tail = self.stderr_tail[-1] if self.stderr_tail else "no message"
        status = "still running" if code is None else f"exit {code}"
        return f"{status}: {tail}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.stdin, self.stdout):
            with contextlib.suppress(OSError):
                stream.close()


class PyslurmBackend:
    """Slurm through pyslurm (``SLURM_CONF`` in the environment picks the cluster)."""

    name = "pyslurm"

    def __init__(
        self,
        timeout: float = DEFAULT_TIMEOUT,
        python: str = sys.executable,
        env: dict[str, str] | None = None,
        site_version: Callable[[], str | None] | None = None,
    ) -> None:
        self._timeout = timeout
        self._argv = [python, "-m", "ingero.slurm.pyslurm_worker"]
        self._env = env
        # The Slurm release this host runs ("25.11"), when known: a pyslurm built for
        # another one is refused before its first call (its RPCs would fail or, worse,
        # misread the controller's answers).
        self._site_version = site_version
        self._worker: _Worker | None = None
        self._lock = threading.Lock()
        self._cluster: str | None = None
        self.hello: dict[str, str] = {}
        self.restarts = 0

    # -- the worker ---------------------------------------------------------------------

    def _start(self, deadline: float) -> _Worker:
        try:
            worker = _Worker(self._argv, self._env)
        except OSError as exc:
            raise SlurmError(f"pyslurm: cannot start the worker: {exc.strerror or exc}") from None
        line = worker.read_line(deadline)
        message = _decode(line) if line is not None else None
        if message is None or "hello" not in message:
            if message is None and not worker.eof:
                worker.stop()
                # libslurm retries a missing slurm.conf for 60 s before it exits: say so.
                said = f": {worker.stderr_tail[-1]}" if worker.stderr_tail else ""
                raise SlurmError(
                    f"pyslurm: no answer within {self._timeout:g}s while loading{said}"
                )
            why = message.get("fatal") if message else None
            why = why or f"the worker ended: {worker.last_words()}"
            worker.stop()
            raise SlurmError(f"pyslurm: {why}")
        hello = {str(k): str(v) for k, v in dict(message["hello"]).items()}
        site = self._site_version() if self._site_version else None
        built = release(hello.get("slurm", ""))
        if site is not None and release(site) != built:
            worker.stop()
            raise SlurmError(
                f"pyslurm {hello.get('pyslurm')} is built for Slurm {built}, this host runs "
                f"Slurm {release(site) or site}: install the pyslurm release matching it"
            )
        self.hello = hello
        return worker

    def _call(self, what: str, request: dict[str, object]) -> Any:
        with self._lock:
            deadline = time.monotonic() + self._timeout
            if self._worker is None or self._worker.proc.poll() is not None:
                if self._worker is not None:
                    self._worker.stop()
                    self.restarts += 1
                self._worker = None
                self._worker = self._start(deadline)
            worker = self._worker
            try:
                worker.stdin.write(json.dumps(request).encode() + b"\n")
                worker.stdin.flush()
            except OSError:
                self._worker = None
                words = worker.last_words()
                worker.stop()
                raise SlurmError(f"pyslurm {what}: the worker ended: {words}") from None
            line = worker.read_line(deadline)
            if line is None:
                # Stuck in libslurm (slurmctld frozen) or dead: this worker is done for.
                self._worker = None
                if not worker.eof:
                    worker.stop()
                    raise SlurmError(f"pyslurm {what}: no answer within {self._timeout:g}s")
                words = worker.last_words()
                worker.stop()
                raise SlurmError(f"pyslurm {what}: the worker ended: {words}")
        answer = _decode(line)
        if answer is None:
            raise SlurmError(f"pyslurm {what}: unreadable answer {line[:60]!r}")
        if "error" in answer:
            raise SlurmError(f"pyslurm {what}: {answer['error']}")
        return answer.get("ok")

    def close(self) -> None:
        with self._lock:
            if self._worker is not None:
                self._worker.stop()
                self._worker = None

    def start(self) -> dict[str, str]:
        """Start the worker now (not on the first call); its versions. Raises SlurmError."""
        with self._lock:
            if self._worker is None or self._worker.proc.poll() is not None:
                self._worker = self._start(time.monotonic() + self._timeout)
            return dict(self.hello)

    # -- the SlurmBackend contract -----------------------------------------------------

    def cluster_name(self) -> str:
        if self._cluster is None:  # fixed for the life of slurmctld: read once
            name = self._call("show config", {"op": "cluster_name"})
            if not isinstance(name, str) or not name or name == "(null)":
                raise SlurmError("pyslurm show config: no ClusterName")
            self._cluster = name
        return self._cluster

    def nodes(self) -> list[NodeInfo]:
        rows = self._call("show node", {"op": "nodes"})
        if not isinstance(rows, list) or not rows:
            raise SlurmError("pyslurm show node: no nodes listed")
        nodes = []
        for row in rows:
            if not isinstance(row, dict) or not isinstance(row.get("name"), str):
                raise SlurmError("pyslurm show node: a node entry has no name")
            reason = row.get("reason") or None
            changed = row.get("reason_time")
            nodes.append(
                node_from_state(
                    row["name"],
                    str(row.get("state") or "UNKNOWN"),
                    reason=reason if isinstance(reason, str) else None,
                    reason_user=row.get("reason_user") or None,
                    reason_time=float(changed)
                    if isinstance(changed, int | float) and changed
                    else None,
                )
            )
        return nodes

    def drain(self, node: str, reason: str) -> None:
        check_node_name(node)
        check_reason(reason)
        self._call(f"update nodename={node}", {"op": "drain", "node": node, "reason": reason})

    def resume(self, node: str) -> None:
        check_node_name(node)
        self._call(f"update nodename={node}", {"op": "resume", "node": node})

    # -- job lookups ---------------------------------------------------------------------

    def job_nodes(self, job_id: str) -> list[str]:
        """The nodes of a running job in node-rank order (index = ``SLURM_NODEID``)."""
        nodes = self._call(f"show job {job_id}", {"op": "job_nodes", "job": job_id})
        if nodes is None:
            raise SlurmError(f"job {job_id} has no nodes (yet): is it still pending?")
        if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
            raise SlurmError(f"pyslurm show job {job_id}: unreadable node list")
        return [str(n) for n in nodes]

    # -- accounting (slurmdbd, through libslurm's slurmdb API) ---------------------------

    @property
    def admin_comment_lowercased(self) -> bool:
        return False  # slurmdb_job_modify stores the text as given

    def job_record(self, job_id: str) -> JobRecord | None:
        check_job_id(job_id)
        records = [
            r
            for r in _records(self._call(f"sacct -j {job_id}", {"op": "job_record", "job": job_id}))
            if r.job_id == job_id
        ]
        return records[-1] if records else None

    def ended_jobs(self, since: float, until: float) -> list[JobRecord]:
        rows = self._call("sacct", {"op": "ended_jobs", "since": since, "until": until})
        return [r for r in _records(rows) if r.ended]

    def set_admin_comment(self, job_id: str, text: str) -> None:
        check_job_id(job_id)
        check_admin_comment(text)
        self._call(f"modify job {job_id}", {"op": "set_admin_comment", "job": job_id, "text": text})


def _records(rows: object) -> list[JobRecord]:
    if not isinstance(rows, list):
        raise SlurmError("pyslurm sacct: unreadable job list")
    out = []
    for row in rows:
        if not isinstance(row, dict) or not isinstance(row.get("job_id"), str):
            raise SlurmError("pyslurm sacct: a job entry has no id")
        start, end, nodes = row.get("start"), row.get("end"), row.get("nodes")
        comment = row.get("admin_comment")
        out.append(
            JobRecord(
                job_id=row["job_id"],
                state=str(row.get("state") or "UNKNOWN").split()[0].upper(),
                start=float(start) if isinstance(start, int | float) and start else None,
                end=float(end) if isinstance(end, int | float) and end else None,
                nodes=nodes if isinstance(nodes, int) else None,
                admin_comment=comment if isinstance(comment, str) and comment else None,
            )
        )
    return out


def _decode(line: bytes) -> dict[str, Any] | None:
    try:
        message = json.loads(line)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None
