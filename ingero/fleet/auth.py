"""Optional bearer-token check and TLS material shared by every Fleet listener."""

from __future__ import annotations

import hmac
import ssl
from pathlib import Path

import grpc

from ingero.errors import ConfigError
from ingero.fleet.config import AuthConfig


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


def _read(path: str, key: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path}: {exc.strerror or exc}") from None


def load_auth(config: AuthConfig) -> BearerAuth:
    if config.bearer_token_file is None:
        return BearerAuth(None)
    token = _read(config.bearer_token_file, "auth.bearer_token_file").decode().strip()
    if not token:
        raise ConfigError(f"auth.bearer_token_file: {config.bearer_token_file} is empty")
    return BearerAuth(token)


def server_ssl_context(config: AuthConfig) -> ssl.SSLContext | None:
    if config.tls_cert is None or config.tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(config.tls_cert, config.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"auth.tls_cert/tls_key: cannot load {config.tls_cert}: {exc}") from None
    return context


def grpc_server_credentials(config: AuthConfig) -> grpc.ServerCredentials | None:
    if config.tls_cert is None or config.tls_key is None:
        return None
    cert = _read(config.tls_cert, "auth.tls_cert")
    key = _read(config.tls_key, "auth.tls_key")
    return grpc.ssl_server_credentials([(key, cert)])
