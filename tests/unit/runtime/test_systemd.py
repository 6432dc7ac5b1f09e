"""sd_notify and the watchdog period, shared by every daemon (ingero.runtime.systemd)."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from pathlib import Path

import pytest

from ingero.runtime.systemd import notifier, watchdog_interval


@pytest.mark.parametrize(
    ("usec", "pid", "expected"),
    [
        (None, None, None),
        ("0", None, None),
        ("junk", None, None),
        ("-5", None, None),
        ("10000000", None, 5.0),
        ("10000000", "self", 5.0),
        ("10000000", "other", None),  # systemd watches another process of the unit
    ],
)
def test_watchdog_interval(
    monkeypatch: pytest.MonkeyPatch, usec: str | None, pid: str | None, expected: float | None
) -> None:
    for name, value in (("WATCHDOG_USEC", usec), ("WATCHDOG_PID", pid)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            own = os.getpid()
            text = {"self": str(own), "other": str(own + 1)}.get(value, value)
            monkeypatch.setenv(name, text)
    assert watchdog_interval() == expected


def test_notify_reaches_the_socket_systemd_gave(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(str(path))
        listener.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        notifier().notify("READY=1\nSTATUS=up")
        assert listener.recv(4096) == b"READY=1\nSTATUS=up"


def test_without_systemd_notifying_is_silent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    notifier().notify("READY=1")  # nothing to reach, nothing raised


def test_a_notify_socket_nobody_reads_never_blocks_the_sender(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The demo's notify socket after its summary: bound, never read. A Unix datagram socket
    queues ten datagrams (net.unix.max_dgram_qlen); a blocking send would hang the agent at
    the eleventh. Every send must return; what did not fit is dropped, the first kept."""
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as unread:
        unread.bind(str(path))
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        sender = notifier()
        finished = threading.Event()

        def ping() -> None:
            for n in range(200):
                sender.notify(f"STATUS=tick {n}")
            finished.set()

        worker = threading.Thread(target=ping, daemon=True)
        worker.start()
        # generous: 200 non-blocking sends take microseconds; a blocked one never returns
        worker.join(timeout=30)
        assert finished.is_set(), "notify blocked on a full, unread socket"
        unread.setblocking(False)
        kept = []
        with contextlib.suppress(BlockingIOError):
            while True:
                kept.append(unread.recv(4096))
    assert kept[0] == b"STATUS=tick 0"
    assert 0 < len(kept) < 200  # the rest were dropped, not queued without bound
