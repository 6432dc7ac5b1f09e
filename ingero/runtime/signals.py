"""Stopping on SIGTERM and SIGINT without a lock in the signal handler.

Python runs a signal handler in the main thread between two bytecodes, wherever that thread
is, and :meth:`threading.Event.set` takes the event's condition lock, which is not
re-entrant. A handler that sets a ``threading.Event`` therefore deadlocks the daemon when the
signal lands while the main thread itself holds that lock: inside ``set()`` (a second SIGTERM
while the first one's ``set()`` runs: ``systemctl stop`` then a Ctrl-C, or a supervisor that
repeats its signal) or in the few bytecodes of ``wait()`` before the lock is released. The
process then never exits and systemd kills it after ``TimeoutStopSec``, losing what the stop
would have flushed.

:class:`SignalEvent` is a ``threading.Event`` whose ``set()`` takes no lock: a flag and a byte
written to a non-blocking pipe, both safe at any point of the main thread. ``wait()`` polls
the pipe, so any number of threads wake at once, as with the event it replaces, and the class
goes wherever a ``threading.Event`` is expected.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import signal
from collections.abc import Callable
from threading import Event
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SignalEvent(Event):
    """A ``threading.Event`` that a signal handler may set (see the module's docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._set = False
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)

    def __del__(self) -> None:
        for fd in (getattr(self, "_read_fd", -1), getattr(self, "_write_fd", -1)):
            if fd >= 0:
                os.close(fd)

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        # A full pipe already holds a byte: waiters wake anyway.
        with contextlib.suppress(BlockingIOError):
            os.write(self._write_fd, b"\0")

    def clear(self) -> None:
        # The flag first: a set() between the two lines leaves the flag up, and wait()
        # looks at the flag before the pipe.
        self._set = False
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read_fd, 4096):
                pass

    def wait(self, timeout: float | None = None) -> bool:
        if self._set:
            return True
        poller = select.poll()
        poller.register(self._read_fd, select.POLLIN)
        # poll() retries after a signal (PEP 475) and a handler that sets this event makes
        # the pipe readable, so the wait ends at once.
        poller.poll(None if timeout is None else max(0, int(timeout * 1000 + 0.999)))
        return self._set


class StopSignals:
    """SIGTERM and SIGINT set ``event``; the first one handled is kept for the log line the
    caller writes afterwards (logging from the handler would re-enter the stream lock the
    main thread may hold). With both pending at once, as on a loaded machine when a
    supervisor repeats its signal, CPython handles them in signal-number order, so SIGINT
    is named even where SIGTERM arrived first."""

    def __init__(self, event: SignalEvent, also: Callable[[], None] | None = None) -> None:
        self.event = event
        self.received: int | None = None
        self._also = also

    def install(self) -> StopSignals:
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._handle)
        # Python puts the default action back while it shuts down, and the default action of
        # SIGTERM ends the process there: a signal repeated after the daemon's stop would end
        # it with 143 before buffered output is written. From the exit handlers on, nothing
        # is left to stop, so later stop signals are ignored.
        atexit.register(_ignore_stop_signals)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
        self.event.set()
        if self._also is not None:
            self._also()

    @property
    def name(self) -> str:
        """The first handled stop signal's name (SIGTERM), or "" when none came."""
        return signal.Signals(self.received).name if self.received is not None else ""


def _ignore_stop_signals() -> None:
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def stop_on_signals(also: Callable[[], None] | None = None) -> tuple[SignalEvent, StopSignals]:
    """A new :class:`SignalEvent` that SIGTERM and SIGINT set from now on (main thread only,
    as every Python signal handler); ``also`` runs after it, in the handler, and must be
    as careful (set other :class:`SignalEvent`\\ s, assign attributes)."""
    event = SignalEvent()
    return event, StopSignals(event, also).install()
