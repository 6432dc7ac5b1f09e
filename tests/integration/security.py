"""Shared by the TLS and security tests of Fleet and Echo: certificates made with openssl
(self-signed, or a CA and leaves it signs), the certificate a listener serves, atomic
file replacement as an operator's rotation does it, and a sender pushing back to back."""

from __future__ import annotations

import hashlib
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from ingero.otlp.exporter import ExportError, HttpExporter
from ingero.otlp.logs import encode_events
from ingero.schema.events import Event

SAN = "subjectAltName=DNS:localhost,IP:127.0.0.1"


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_cert(tmp: Path) -> tuple[Path, Path]:
    """A self-signed localhost certificate and its key."""
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
            "/CN=localhost", "-addext", SAN, "-keyout", str(key), "-out", str(cert))  # fmt: skip
    return cert, key


def make_ca(tmp: Path, name: str = "ca") -> tuple[Path, Path]:
    ca, ca_key = tmp / f"{name}.pem", tmp / f"{name}.key"
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
            f"/CN=test-{name}", "-keyout", str(ca_key), "-out", str(ca))  # fmt: skip
    return ca, ca_key


def make_leaf(tmp: Path, ca: Path, ca_key: Path, name: str) -> tuple[Path, Path]:
    """A localhost certificate signed by the test CA (each call: a new key and serial)."""
    cert, key, csr = tmp / f"{name}.pem", tmp / f"{name}.key", tmp / f"{name}.csr"
    ext = tmp / "san.ext"
    ext.write_text(SAN + "\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
            "-keyout", str(key), "-out", str(csr))  # fmt: skip
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
            "-CAcreateserial", "-days", "1", "-extfile", str(ext), "-out", str(cert))  # fmt: skip
    return cert, key


def replace(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, as an operator's rotation would."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    tmp.replace(path)


def refuses_token(exporter: HttpExporter) -> bool:
    """Whether an events request with ``exporter``'s token is refused as unauthorised (a
    retired token past its grace window)."""
    try:
        exporter.send(encode_events([Event("straggler_state", "old", "A", 1.0, score=0.1)]))
    except ExportError as exc:
        return "HTTP 401" in str(exc)
    return False


def served_fingerprint(address: str, ca: Path) -> str:
    """SHA-256 of the certificate a new TLS connection to ``address`` is served."""
    port = int(address.rpartition(":")[2])
    context = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return hashlib.sha256(der).hexdigest()


def pem_fingerprint(cert: Path) -> str:
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(cert.read_text())).hexdigest()


class BackToBack(threading.Thread):
    """Calls ``send(i)`` back to back until halted: None is a success, a string the
    failure it reports; both are counted."""

    def __init__(self, send: Callable[[int], str | None]) -> None:
        super().__init__(daemon=True)
        self.send = send
        self.ok = 0
        self.failures: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.halt.is_set():
            i += 1
            failure = self.send(i)
            if failure is None:
                self.ok += 1
            else:
                self.failures.append(failure)

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=30)


class RotationCerts:
    """Two CAs and a leaf each signed (``a`` by ``ca_a``, ``b`` by ``ca_b``), ``ca`` a
    bundle trusting both (what senders trust through a rotation), and the paths a server is
    configured with (``cert``, ``key``), holding ``a`` until :meth:`use` installs another.
    A client trusting only ``ca_b`` connects only once ``b`` is served."""

    def __init__(self, tmp: Path) -> None:
        self.ca_a, key_a = make_ca(tmp, "ca-a")
        self.ca_b, key_b = make_ca(tmp, "ca-b")
        self.a = make_leaf(tmp, self.ca_a, key_a, "a")
        self.b = make_leaf(tmp, self.ca_b, key_b, "b")
        self.ca = tmp / "ca-bundle.pem"
        self.ca.write_bytes(self.ca_a.read_bytes() + self.ca_b.read_bytes())
        self.cert, self.key = tmp / "server.pem", tmp / "server.key"
        self.use(self.a)

    def use(self, leaf: tuple[Path, Path]) -> None:
        replace(self.cert, leaf[0].read_bytes())
        replace(self.key, leaf[1].read_bytes())

    def served(self, address: str) -> Path:
        """Which leaf a new connection to ``address`` is served."""
        served = served_fingerprint(address, self.ca)
        return next(c for c, _ in (self.a, self.b) if pem_fingerprint(c) == served)
