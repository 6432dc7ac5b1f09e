"""fleet-push's journald channel: each event through the one journal writer (ingero.journald)."""

from __future__ import annotations

from ingero.events import Event
from ingero.journald import EventJournal, encode_fields

__all__ = ["JournaldChannel", "encode_fields"]


class JournaldChannel(EventJournal):
    name = "journald"

    def send(self, event: Event) -> None:
        self.write(event)
