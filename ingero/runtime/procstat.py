"""``/proc/PID/stat`` read past its command name, for the few fields ingero needs of it."""

from __future__ import annotations

from pathlib import Path


def stat_fields(path: Path) -> list[bytes] | None:
    """The fields of a ``/proc/PID/stat`` file after the parenthesised command name (field 3
    on: the state is index 0), which may itself hold spaces and parentheses, so they are
    counted from its last ``)``; None when unreadable."""
    try:
        with open(path, "rb") as f:
            raw = f.read(4096)
    except OSError:
        return None
    return raw[raw.rfind(b")") + 1 :].split()
