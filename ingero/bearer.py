"""Bearer tokens on every link that carries one: read from a file, sent, and checked.

fleet-push reads its token file and sends ``Authorization: Bearer <token>`` (HTTP header or
gRPC metadata); Fleet checks it with :class:`BearerAuth`; Fleet's forwarder and the MCP
bridge send Echo theirs the same way (Echo checks scoped tokens, ``ingero.echo.auth``).
"""

from __future__ import annotations

import hmac
from pathlib import Path

from ingero.errors import ConfigError


def authorization(token: str) -> str:
    """The ``Authorization`` value (HTTP header, gRPC metadata) that presents ``token``."""
    return f"Bearer {token}"


def read_token(path: str | None, key: str) -> str | None:
    """The token in the file at ``path`` (None when no file is configured); a one-line
    ConfigError naming the setting ``key`` when it cannot be read or is empty."""
    if not path:
        return None
    try:
        token = Path(path).read_bytes().decode().strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise ConfigError(f"{key}: cannot read {path}: {reason}") from None
    if not token:
        raise ConfigError(f"{key}: {path} is empty")
    return token


class BearerAuth:
    """Constant-time check of ``Authorization: Bearer <token>``; no token configured = open.

    The scheme name is case-insensitive (RFC 7235): ``bearer`` and ``BEARER`` work too.
    """

    def __init__(self, token: str | None) -> None:
        self._expected = token.encode() if token else None

    @property
    def enabled(self) -> bool:
        return self._expected is not None

    def allows(self, authorization: str | None) -> bool:
        if self._expected is None:
            return True
        if authorization is None:
            return False
        scheme, _, token = authorization.partition(" ")
        same = hmac.compare_digest(token.strip().encode("utf-8", "replace"), self._expected)
        return same and scheme.lower() == "bearer"
