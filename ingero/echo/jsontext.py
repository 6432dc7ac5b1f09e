"""Answers as JSON text that always encodes, whatever strings the store gave back.

A stored event's ``extra`` is JSON, and JSON can spell a lone UTF-16 surrogate
(``"\\ud800"``), which Python reads back as a string UTF-8 cannot encode: written as UTF-8
the answer would fail (HTTP 500). The HTTP API writes such a string escaped, as JSON allows
(read back, it is the same string); MCP's structured content must be UTF-8 text, so there
an unpaired surrogate becomes U+FFFD, as a UTF-8 decoder would show it.
"""

from __future__ import annotations

import json
from typing import Any


def encode_answer(content: Any) -> bytes:
    """Compact JSON in UTF-8 (as Starlette writes it); escaped ASCII when a string of
    ``content`` holds a lone surrogate, UTF-8 cannot."""
    text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")


def utf8_safe(value: Any) -> Any:
    """``value`` with every string UTF-8 can encode: unpaired surrogates become U+FFFD
    (paired ones, split in two code points, are joined). Unchanged values are not copied."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return value
    if isinstance(value, dict):
        return {utf8_safe(k): utf8_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [utf8_safe(v) for v in value]
    return value
