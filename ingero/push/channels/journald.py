"""fleet-push's journald channel: each event through the one journal writer (ingero.runtime.journald)."""

from __future__ import annotations

from ingero.runtime.journald import EventJournal, encode_fields
from ingero.schema.events import Event

__all__ = ["JournaldChannel", "encode_fields"]


class JournaldChannel(EventJournal):
    name = "journald"

    def send(self, event: Event) -> None:
        self.write(event)
