"""TLS material for every listener and client: server certificates, client trust roots.

Fleet and Echo load their certificate and key through :func:`server_ssl_context` (HTTP
listeners) and :func:`grpc_server_credentials` (gRPC); fleet-push and Fleet's forwarder
trust a CA file, or the system's roots, through :func:`client_ssl_context` and
:func:`grpc_channel_credentials`. Every failure is one ConfigError naming the setting.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import TYPE_CHECKING

from ingero.errors import ConfigError

if TYPE_CHECKING:  # grpc is imported where used: an HTTP-only fleet-push never loads it
    import grpc


def check_pair(cert: str | None, key: str | None, section: str = "auth") -> None:
    """Config validation: a certificate needs its key, and a key its certificate."""
    if (cert is None) != (key is None):
        raise ValueError(f"{section}.tls_cert and {section}.tls_key must be set together")


def _read(path: str, setting: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{setting}: cannot read {path}: {exc.strerror or exc}") from None


def server_ssl_context(
    cert: str | None, key: str | None, section: str = "auth"
) -> ssl.SSLContext | None:
    """A server context with the certificate chain loaded; None without a certificate."""
    if cert is None or key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{section}.tls_cert/tls_key: cannot load {cert}: {exc}") from None
    return context


def grpc_server_credentials(
    cert: str | None, key: str | None, section: str = "auth"
) -> grpc.ServerCredentials | None:
    """gRPC server credentials from the same PEM files; None without a certificate."""
    if cert is None or key is None:
        return None
    import grpc

    chain = _read(cert, f"{section}.tls_cert")
    private = _read(key, f"{section}.tls_key")
    return grpc.ssl_server_credentials([(private, chain)])


def client_ssl_context(ca_file: str | None, setting: str = "ca_file") -> ssl.SSLContext | None:
    """A client context trusting ``ca_file``; None (urllib's default: the system's roots)
    when no CA file is configured."""
    if not ca_file:
        return None
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{setting}: cannot load {ca_file}: {exc}") from None


def grpc_channel_credentials(
    ca_file: str | None, setting: str = "ca_file"
) -> grpc.ChannelCredentials:
    """gRPC channel credentials trusting ``ca_file``, else grpc's default roots (which
    honour ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``)."""
    import grpc

    if not ca_file:
        return grpc.ssl_channel_credentials()
    return grpc.ssl_channel_credentials(_read(ca_file, setting))
