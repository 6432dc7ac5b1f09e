"""TLS material for every listener and client: server certificates, client trust roots.

Fleet and Echo load their certificate and key through :func:`server_ssl_context` (HTTP
listeners) and :func:`grpc_server_credentials` (gRPC); fleet-push and Fleet's forwarder
trust a CA file, or the system's roots, through :func:`client_ssl_context` and
:func:`grpc_channel_credentials`. Every failure is one ConfigError naming the setting.
"""

from __future__ import annotations

import logging
import ssl
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from ingero.runtime.errors import ConfigError

if TYPE_CHECKING:  # grpc is imported where used: an HTTP-only fleet-push never loads it
    import grpc

log = logging.getLogger(__name__)


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


class ServerTls:
    """A listener certificate and key that :meth:`reload` replaces without a restart.

    HTTP listeners get :meth:`ssl_context`: a front context whose SNI callback (which
    OpenSSL calls on every ClientHello, with or without a server name) hands each new
    handshake the context loaded last, so connections already open keep theirs. gRPC gets
    :meth:`grpc_credentials`: grpc's dynamic credentials, whose fetcher grpc calls before
    new handshakes and which answer the new pair once after each reload. A reload that
    cannot load the new pair raises ConfigError and keeps the old one.
    """

    def __init__(self, cert: str, key: str, section: str = "auth") -> None:
        self.cert, self.key, self.section = cert, key, section
        self._lock = threading.Lock()
        self._current, self._pem = self._load()
        self._generation = 0
        self._grpc_seen = 0
        self._front: ssl.SSLContext | None = None

    def _load(self) -> tuple[ssl.SSLContext, tuple[bytes, bytes]]:
        context = server_ssl_context(self.cert, self.key, self.section)
        assert context is not None
        # the same files, read once more for grpc; a pair that ssl just loaded is valid PEM
        chain = _read(self.cert, f"{self.section}.tls_cert")
        private = _read(self.key, f"{self.section}.tls_key")
        return context, (private, chain)

    def reload(self) -> None:
        """Load the files again; ConfigError (the old pair stays in use) when they fail."""
        context, pem = self._load()
        with self._lock:
            self._current, self._pem = context, pem
            self._generation += 1

    def ssl_context(self) -> ssl.SSLContext:
        if self._front is None:
            front = server_ssl_context(self.cert, self.key, self.section)
            assert front is not None
            front.sni_callback = self._pick
            self._front = front
        return self._front

    def _pick(self, conn: ssl.SSLObject, server_name: str | None, front: ssl.SSLContext) -> None:
        conn.context = self._current

    def grpc_credentials(self) -> grpc.ServerCredentials:
        import grpc

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            with self._lock:
                if self._grpc_seen == self._generation:
                    return None  # unchanged: grpc keeps the configuration it has
                self._grpc_seen = self._generation
                return grpc.ssl_server_certificate_configuration([self._pem])

        initial = grpc.ssl_server_certificate_configuration([self._pem])
        return grpc.dynamic_ssl_server_credentials(initial, fetch)


def server_tls(cert: str | None, key: str | None, section: str = "auth") -> ServerTls | None:
    """The reloadable TLS material of a listener; None without a certificate."""
    return ServerTls(cert, key, section) if cert is not None and key is not None else None


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
