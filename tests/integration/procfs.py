"""What the kernel says about a daemon the tests started."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path


def rss_bytes(pid: int) -> int:
    """The process's resident set size (VmRSS of /proc/PID/status), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def child_pid(word: str) -> int | None:
    """The pid of a child of this process with ``word`` as one of its arguments."""
    me = os.getpid()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
            argv = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(fields[1]) == me and word.encode() in argv:
            return int(stat.parent.name)
    return None


def state(pid: int) -> str:
    """The process's state letter (R, S, T stopped, Z zombie ...); X when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return "X"


def maps_contain(pid: int, fragment: str) -> bool:
    try:
        return fragment in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


class HangupsWhileStarting(threading.Thread):
    """SIGHUP, again and again, to the daemon this test is starting (the child process with
    ``word`` among its arguments: its configuration file's path), while it is not ready yet. From the moment the daemon maps ``loaded`` (grpc: its start imports
    it, then loads its configuration and binds) each SIGHUP goes to the process while it is
    stopped (SIGSTOP) and not ``ready()``: so it lands during start-up, whatever the timing.
    ``during_start`` counts those; the thread ends once the daemon is ready, or at ``stop``.
    A child that is gone is replaced by the next one with ``word`` (a start retried on
    other ports: the retry must see SIGHUPs too)."""

    def __init__(self, word: str, ready: Callable[[], bool], loaded: str = "cygrpc") -> None:
        super().__init__(name="hangups", daemon=True)
        self.word = word
        self.ready = ready
        self.loaded = loaded
        self.during_start = 0
        self._done = threading.Event()

    def stop(self) -> None:
        self._done.set()
        self.join(30)

    def run(self) -> None:
        pid = None
        while not self._done.is_set():
            pid = pid or child_pid(self.word)
            if pid is None or not maps_contain(pid, self.loaded):
                if pid is not None and state(pid) in "ZX":
                    pid = None
                time.sleep(0.002)
                continue
            target, pid = pid, None  # kept below while it lives
            try:
                os.kill(target, signal.SIGSTOP)
            except ProcessLookupError:
                continue
            try:
                while state(target) not in "TtZX":
                    time.sleep(0.001)
                if self.ready():
                    return
                if state(target) in "ZX":
                    continue
                pid = target
                os.kill(target, signal.SIGHUP)
                self.during_start += 1
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(target, signal.SIGCONT)
            time.sleep(0.01)
