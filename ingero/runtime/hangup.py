"""SIGHUP while a daemon starts: queued for after start-up, never the default action.

The default action of SIGHUP ends the process, and a daemon installs its own reload
handler only once it serves. A SIGHUP in between (logrotate, ``systemctl reload`` racing
a start) would kill it, so each daemon's command installs :class:`StartupHangups` first
thing, before it loads its configuration or binds anything; once ready, with its own
handler in place, the daemon asks :meth:`StartupHangups.take` and reloads once if any
SIGHUP came meanwhile.
"""

from __future__ import annotations

import logging
import signal
from types import FrameType

log = logging.getLogger(__name__)


class StartupHangups:
    def __init__(self, daemon: str) -> None:
        self.daemon = daemon
        self._count = 0

    def install(self) -> StartupHangups:
        """Catch SIGHUP from now on (main thread only, as every Python signal handler)."""
        signal.signal(signal.SIGHUP, self._queue)
        return self

    def _queue(self, signum: int, frame: FrameType | None) -> None:
        # Only a count: the handler may run in the middle of anything, logging included.
        self._count += 1

    def take(self) -> bool:
        """Whether a SIGHUP came during start-up (then the caller reloads once). Call it
        after the daemon's own SIGHUP handler replaced this one, so none is missed."""
        count, self._count = self._count, 0
        if count:
            log.info(
                "%s: %d SIGHUP during start-up, reloading once now that it is ready",
                self.daemon,
                count,
            )
        return count > 0


def ignore_hangups(daemon: str, why: str) -> None:
    """For a daemon with nothing to reload: SIGHUP is logged and ignored.

    Its default action ends the process, and systemd counts SIGHUP among the clean exit
    signals, so ``Restart=on-failure`` would not bring the unit back: a stray ``pkill
    -HUP ingero`` or a logrotate ``postrotate`` meant for another daemon would stop a
    node's tracer or pusher for good. Installed first thing by the command, before the
    configuration is read. ``why``: what the line says instead of reloading."""

    def on_hangup(signum: int, frame: FrameType | None) -> None:
        log.info("%s: SIGHUP ignored: %s", daemon, why)

    signal.signal(signal.SIGHUP, on_hangup)
