"""What every ingero daemon shares with systemd: sd_notify, the watchdog period, journald.

``Type=notify`` units (trace, fleet-push, fleet, echo) say ``READY=1``, ``STATUS=…``,
``WATCHDOG=1`` and ``STOPPING=1`` through :func:`notifier`; a watched process pings at
:func:`watchdog_interval`, half of its ``WatchdogSec``. Standard library only at import
(the Slurm hooks read :data:`JOURNAL_SOCKET`); sdnotify is imported when a notifier is made.
"""

from __future__ import annotations

import os
from typing import Protocol

JOURNAL_SOCKET = "/run/systemd/journal/socket"  # journald's native protocol socket


class Notifier(Protocol):
    def notify(self, state: str) -> None: ...


class _Silent:
    """Not started by systemd: every message goes nowhere."""

    def notify(self, state: str) -> None:
        return None


class _NonBlocking:
    """sdnotify's notifier on a non-blocking socket. A notify socket that nobody reads (the
    demo's, once its summary is printed; a stuck service manager) fills after ten datagrams
    (``net.unix.max_dgram_qlen``), and a blocking send would then stall the daemon's loop
    for good; a status message is worth less than that, so a full socket drops it (sdnotify
    swallows the BlockingIOError)."""

    def __init__(self) -> None:
        import sdnotify

        self._inner = sdnotify.SystemdNotifier()
        sock = self._inner.socket  # None when the connect failed: notify is then a no-op
        if sock is not None:
            sock.setblocking(False)

    def notify(self, state: str) -> None:
        self._inner.notify(state)


def notifier() -> Notifier:
    """A non-blocking sdnotify notifier when systemd gave this process ``$NOTIFY_SOCKET``,
    else a silent one (sdnotify connects at construction, so it is only made where it can
    be used)."""
    if not os.environ.get("NOTIFY_SOCKET"):
        return _Silent()
    return _NonBlocking()


def watchdog_interval() -> float | None:
    """Seconds between watchdog pings, half of systemd's ``WatchdogSec`` (``$WATCHDOG_USEC``);
    None when this process is not the one watched (``$WATCHDOG_PID`` names another)."""
    usec = os.environ.get("WATCHDOG_USEC")
    if not usec or not usec.isdigit() or int(usec) == 0:
        return None
    pid = os.environ.get("WATCHDOG_PID")
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None
    return int(usec) / 2e6
