"""fleet-push's journald channel: each event through the one journal writer (ingero.journald)."""

from __future__ import annotations

from ingero.events import Event
from ingero.journald import JournalWriter, encode_fields
from ingero.systemd import JOURNAL_SOCKET

__all__ = ["JournaldChannel", "encode_fields"]


class JournaldChannel:
    name = "journald"

    def __init__(self, path: str = JOURNAL_SOCKET) -> None:
        self._writer = JournalWriter(path)

    def send(self, event: Event) -> None:
        self._writer.write(event.journal_fields())

    def stats(self) -> dict[str, int]:
        return self._writer.stats()

    def close(self) -> None:
        self._writer.close()
