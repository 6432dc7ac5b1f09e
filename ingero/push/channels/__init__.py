"""Event channels: journald (native protocol), a Unix socket (NDJSON) and OTLP logs to Fleet.

Every channel's ``send`` returns at once and never raises: a slow or absent consumer costs
a counted drop, never a blocked or crashed push loop.
"""

from __future__ import annotations

from typing import Protocol

from ingero.schema.events import Event


class Channel(Protocol):
    name: str

    def send(self, event: Event) -> None: ...

    def stats(self) -> dict[str, int]: ...

    def close(self) -> None: ...
