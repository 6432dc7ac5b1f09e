"""Size limits of what Fleet and Echo accept from an OTLP request (part of the wire contract).

A receiver keeps ids and names from every push or event it accepts (Fleet per tracked node,
Echo per stored event and in its episode cache), so their length is what bounds the memory
behind ``limits.max_nodes`` and the disk behind Echo's retention; a value over a limit is
refused with the reason ``too_long``, never cut short (a cut id would name another node).
The decoders in this package enforce them, so every receiver and every transport agree,
and a sender that stays within them is never refused for size.
"""

from __future__ import annotations

from collections.abc import Iterable

# Ids and names, in characters: node, cluster and job ids, host name, GPU model, provider,
# workload type, dominant signal, signal and rate names, detection mode, and the names of
# an event's extra fields. A DNS name is at most 253 characters.
MAX_ID_CHARS = 256
# One OTLP log record (one ingero event), in its protobuf encoding: every attribute and
# the body together. An ingero event is a few hundred bytes.
MAX_EVENT_BYTES = 16 * 1024
# Nesting of an OTLP/JSON body (objects and arrays). An ingero request nests about 12
# deep; each level of an attribute map inside another adds 4.
MAX_JSON_DEPTH = 64

# The rejection reason (ingero_fleet_rejected_total, Echo's ingest.rejected) of a value
# over a limit.
TOO_LONG = "too_long"


class ValueTooLong(ValueError):
    """An id, name or record over its limit; the message names it, never quotes it whole."""


def check_length(name: str, value: str, limit: int = MAX_ID_CHARS) -> str:
    """``value`` itself when within ``limit`` characters, else ValueTooLong naming ``name``."""
    if len(value) > limit:
        raise ValueTooLong(f"{name} is {len(value)} characters long, the limit is {limit}")
    return value


def check_lengths(fields: Iterable[tuple[str, str | None]]) -> None:
    """ValueTooLong naming the first of (name, value) ``fields`` over MAX_ID_CHARS; None is
    an absent field."""
    for name, value in fields:
        if value is not None and len(value) > MAX_ID_CHARS:
            check_length(name, value)


def shown(value: object, width: int = 40) -> str:
    """``repr(value)`` cut to about ``width`` characters, for messages about bad input."""
    if isinstance(value, str | bytes) and len(value) > width:
        return repr(value[:width]) + f"... ({len(value)} long)"
    text = repr(value)
    return text if len(text) <= width else text[:width] + "..."
