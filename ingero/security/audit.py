"""The audit log of Fleet's and Echo's listeners: who was let in, who was refused and why.

Every request a listener checks is recorded: accepted ones by token name and token id (a
SHA-256 prefix, ``ingero.security.bearer.token_id``; never the token), refused ones by reason,
source address and the id of what was presented. Entries go to journald through the one
journal writer (``ingero.runtime.journald``) with their own MESSAGE_ID, so
``journalctl MESSAGE_ID=<AUDIT_MESSAGE_ID> -o json`` reads them.

Cost under a flood is bounded: a request costs one counter increment; once per window
(1 s) each distinct (listener, outcome, token, reason, source) seen in it becomes one
entry with its count (``INGERO_COUNT``). At most ``max_keys`` distinct keys are kept per
window; the rest are summed into one ``overflow`` entry per listener and outcome, so a
flood of made-up tokens from made-up addresses writes a bounded number of lines.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Callable
from typing import NamedTuple

from ingero.runtime.clock import Clock, SystemClock
from ingero.runtime.journald import JournalWriter, stderr_is_journal

log = logging.getLogger(__name__)

AUDIT_MESSAGE_ID = "eb44fb09ea4b4f75b370aa2b61d869e5"
OPEN_LISTENER_MESSAGE_ID = "ac34487964c94ec2a32204f49d5ff393"
WINDOW_S = 1.0
MAX_KEYS = 1000
ACCEPTED = "accepted"
REFUSED = "refused"
OVERFLOW = "overflow"


class AuditKey(NamedTuple):  # a tuple: made and hashed on every request, so cheap
    listener: str
    outcome: str  # accepted | refused
    name: str = ""  # the token's name (accepted only)
    token_id: str = ""  # of the token presented, when one was
    reason: str = ""  # refused only
    source: str = ""  # refused only: who keeps knocking matters, who got in does not


class AuditCounter:
    """The pure core: counts per key within a window; :meth:`take` ends the window."""

    def __init__(self, daemon: str, max_keys: int = MAX_KEYS, clock: Clock | None = None) -> None:
        self.daemon = daemon
        self.max_keys = max_keys
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._counts: dict[AuditKey, int] = {}
        self._since = self._clock.now()

    def record(self, key: AuditKey) -> None:
        with self._lock:
            if key not in self._counts and len(self._counts) >= self.max_keys:
                key = AuditKey(key.listener, key.outcome, OVERFLOW, OVERFLOW, OVERFLOW, OVERFLOW)
            self._counts[key] = self._counts.get(key, 0) + 1

    def take(self) -> list[dict[str, str]]:
        """The journal entries of the window now ending (none when nothing was recorded)."""
        now = self._clock.now()
        with self._lock:
            counts, self._counts = self._counts, {}
            since, self._since = self._since, now
        return [self._entry(k, n, since, now) for k, n in counts.items()]

    def _entry(self, key: AuditKey, count: int, since: float, now: float) -> dict[str, str]:
        who = f"token {key.name} (sha256 {key.token_id})" if key.name else "no token"
        if key.outcome == ACCEPTED:
            message = f"{self.daemon} {key.listener}: {count} request(s) accepted, {who}"
        else:
            shown = f" (sha256 {key.token_id})" if key.token_id else ""
            message = (
                f"{self.daemon} {key.listener}: {count} request(s) refused from "
                f"{key.source or 'unknown'}: {key.reason}{shown}"
            )
        fields = {
            "MESSAGE": message,
            "MESSAGE_ID": AUDIT_MESSAGE_ID,
            "PRIORITY": "6" if key.outcome == ACCEPTED else "4",
            "SYSLOG_IDENTIFIER": f"ingero-{self.daemon}",
            "INGERO_DAEMON": self.daemon,
            "INGERO_LISTENER": key.listener,
            "INGERO_OUTCOME": key.outcome,
            "INGERO_COUNT": str(count),
            "INGERO_WINDOW_START": f"{since:.3f}",
            "INGERO_WINDOW_S": f"{max(0.0, now - since):.3f}",
        }
        for name, value in (
            ("INGERO_TOKEN_NAME", key.name),
            ("INGERO_TOKEN_ID", key.token_id),
            ("INGERO_REASON", key.reason),
            ("INGERO_SOURCE", key.source),
        ):
            if value:
                fields[name] = value
        return fields


class AuditLog:
    """An :class:`AuditCounter` flushed to journald every ``window`` seconds by its own
    thread (never on a request's path); :meth:`close` writes the last window."""

    def __init__(
        self,
        daemon: str,
        window: float = WINDOW_S,
        max_keys: int = MAX_KEYS,
        writer: JournalWriter | None = None,
    ) -> None:
        self.counter = AuditCounter(daemon, max_keys)
        self._writer = writer or JournalWriter()
        self._window = window
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{daemon}-audit", daemon=True)
        self._thread.start()

    def record(self, key: AuditKey) -> None:
        self.counter.record(key)

    def flush(self) -> int:
        entries = self.counter.take()
        for fields in entries:
            self._writer.write(fields)
        return len(entries)

    def _run(self) -> None:
        while not self._stop.wait(self._window):
            self.flush()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.flush()
        self._writer.close()


def is_loopback(host: str) -> bool:
    """Whether a listen host only takes local connections (``localhost`` included)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def warn_open_listeners(
    daemon: str,
    listeners: dict[str, str],
    token_configured: bool,
    write: Callable[[dict[str, str]], bool] | None = None,
) -> list[str]:
    """One warning line (journald, and stderr unless it is the journal) when a listener
    binds a non-loopback address and no token is configured; returns the lines."""
    if token_configured:
        return []
    open_ = {
        name: hostport
        for name, hostport in listeners.items()
        if not is_loopback(hostport.rpartition(":")[0].strip("[]"))
    }
    if not open_:
        return []
    shown = ", ".join(f"{name} {hostport}" for name, hostport in open_.items())
    line = (
        f"{daemon}: listening on a non-loopback address with no bearer token configured "
        f"({shown}): anyone who can reach it is trusted; see docs/security.md"
    )
    fields = {
        "MESSAGE": line,
        "MESSAGE_ID": OPEN_LISTENER_MESSAGE_ID,
        "PRIORITY": "4",
        "SYSLOG_IDENTIFIER": f"ingero-{daemon}",
        "INGERO_DAEMON": daemon,
        "INGERO_LISTENERS": shown,
    }
    if write is not None:
        write(fields)
    else:
        writer = JournalWriter()
        writer.write(fields)
        writer.close()
    if not stderr_is_journal():
        log.warning("%s", line)
    return [line]
