"""Fleet's durable queue of events for Echo: a SQLite file, so a replica SIGKILLed before it
forwarded what it accepted sends it after its restart instead of losing it.

``append`` writes one transaction per call (one receiver request, one tick), bounded by
events and by bytes of event JSON: beyond either bound the newest are refused, and the
caller counts them as dropped. The one sender ``take``s the oldest batch and, once Echo
acknowledged (or refused) it, marks it ``done``, which deletes it; a batch taken but not done
when the process dies is taken again at the next start. Echo de-duplicates on
(timestamp, event_id, type), so sending it twice doubles nothing.

Durability: WAL with ``synchronous=NORMAL``. A committed append is in the WAL file, so it
survives the process being killed (SIGKILL, OOM, a crash) whatever the moment; a power loss
or kernel panic can lose the appends since the last checkpoint (not corrupt the file), since
NORMAL does not fsync each commit. ``FULL`` would fsync every receiver request, milliseconds
on a disk, on the thread that answers the node; docs/fleet.md says so.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

from ingero.runtime.errors import CantCreateError
from ingero.schema.events import Event

log = logging.getLogger(__name__)

SPOOL_FILE = "echo-spool.db"

_SCHEMA = "CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY, body TEXT NOT NULL)"


class SpoolError(CantCreateError):
    """The spool file cannot be created or opened, or is not a spool (one line, exit 73)."""


class EventSpool:
    """Thread-safe: any thread appends, one sender takes and marks done."""

    def __init__(self, directory: str | Path, max_events: int, max_bytes: int) -> None:
        self.path = Path(directory) / SPOOL_FILE
        self.max_events = max_events
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: transactions are the explicit BEGIN/COMMIT below.
            self._db: sqlite3.Connection | None = sqlite3.connect(
                self.path, check_same_thread=False, isolation_level=None, timeout=30
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(_SCHEMA)
            count, size = self._db.execute(
                "SELECT count(*), coalesce(sum(length(body)), 0) FROM events"
            ).fetchone()
        except (OSError, sqlite3.Error) as exc:
            raise SpoolError(f"echo spool {self.path}: {exc}") from None
        self._count: int = count
        self._bytes: int = size
        self._taken: list[tuple[int, int]] = []  # (id, bytes) of the batch in flight
        if count:
            log.info("echo spool %s: %d events from before, forwarded first", self.path, count)

    def __len__(self) -> int:
        """Events waiting, the batch in flight included."""
        with self._lock:
            return self._count

    def size_bytes(self) -> int:
        with self._lock:
            return self._bytes

    def append(self, events: Sequence[Event]) -> int:
        """Store events in one transaction, oldest first, within the bounds; returns how many
        were stored (the newest beyond a bound are not)."""
        bodies = [event.to_json() for event in events]  # outside the lock: the costly part
        with self._lock:
            if self._db is None:
                return 0
            room_events = self.max_events - self._count
            room_bytes = self.max_bytes - self._bytes
            taken: list[tuple[str]] = []
            added = 0
            for body in bodies:
                if len(taken) >= room_events or added + len(body) > room_bytes:
                    break
                taken.append((body,))
                added += len(body)
            if not taken:
                return 0
            self._db.execute("BEGIN")
            try:
                self._db.executemany("INSERT INTO events (body) VALUES (?)", taken)
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                # A full disk (or a file gone bad) refuses these, as a bound would: the
                # caller counts them dropped; the spool keeps what it holds and goes on.
                if self._db.in_transaction:  # SQLITE_FULL has rolled back already
                    self._db.execute("ROLLBACK")
                log.error("echo spool %s: %d events not stored: %s", self.path, len(taken), exc)
                return 0
            self._count += len(taken)
            self._bytes += added
            return len(taken)

    def take(self, limit: int) -> tuple[list[Event], int]:
        """The oldest ``limit`` events (left stored until ``done``), and how many stored rows
        did not parse as events (dropped by ``done`` too)."""
        with self._lock:
            if self._db is None:
                return [], 0
            rows = self._db.execute(
                "SELECT id, body FROM events ORDER BY id LIMIT ?", (limit,)
            ).fetchall()
            self._taken = [(row_id, len(body)) for row_id, body in rows]
        events: list[Event] = []
        bad = 0
        for _, body in rows:
            try:
                events.append(Event.from_dict(json.loads(body)))
            except ValueError as exc:  # json.JSONDecodeError is a ValueError
                bad += 1
                log.error("echo spool: dropped a stored event that does not parse: %s", exc)
        return events, bad

    def done(self) -> None:
        """Delete the batch last taken: Echo acknowledged it, or refused it for good."""
        with self._lock:
            if self._db is None or not self._taken:
                return
            # Rows appended meanwhile have larger ids (rowid = max + 1), so this is the batch.
            try:
                self._db.execute("DELETE FROM events WHERE id <= ?", (self._taken[-1][0],))
            except sqlite3.Error as exc:
                # Kept: the batch is taken and sent again (Echo stores it once), and the
                # sender thread lives on.
                log.error("echo spool %s: a sent batch not deleted: %s", self.path, exc)
                return
            self._count -= len(self._taken)
            self._bytes -= sum(size for _, size in self._taken)
            self._taken = []

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
