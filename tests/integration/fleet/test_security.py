"""Fleet's security surface against the real daemon: token and certificate rotation on
SIGHUP under continuous pushes, rate limits answered 429/RESOURCE_EXHAUSTED and honoured by
fleet-push's client, and the warning for an open listener."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)

from ingero.otlp.health import NodePush
from ingero.push.client import make_client
from ingero.push.config import PushConfig
from tests.integration.fleet.helpers import Fleet, health_request, start_fleet, wait_for


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_ca(tmp: Path) -> tuple[Path, Path]:
    ca, ca_key = tmp / "ca.pem", tmp / "ca.key"
    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        str(ca_key),
        "-out",
        str(ca),
    )
    return ca, ca_key


def make_leaf(tmp: Path, ca: Path, ca_key: Path, name: str) -> tuple[Path, Path]:
    """A localhost certificate signed by the test CA (each call: a new key and serial)."""
    cert, key, csr = tmp / f"{name}.pem", tmp / f"{name}.key", tmp / f"{name}.csr"
    ext = tmp / "san.ext"
    ext.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        str(key),
        "-out",
        str(csr),
    )
    openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        str(ext),
        "-out",
        str(cert),
    )
    return cert, key


def replace(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, as an operator's rotation would."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    tmp.replace(path)


def served_fingerprint(address: str, ca: Path) -> str:
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


class Pusher(threading.Thread):
    """fleet-push's own client (HTTP or gRPC), pushing back to back until stopped."""

    def __init__(self, config: PushConfig, node: str) -> None:
        super().__init__(daemon=True)
        self.client = make_client(config)
        self.node = node
        self.ok = 0
        self.failures: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.halt.is_set():
            i += 1
            push = NodePush(node_id=self.node, cluster_id="c", score=0.9 - (i % 3) * 0.01)
            result = self.client.push(health_request([push]))
            if result.ok:
                self.ok += 1
            else:
                self.failures.append(str(result.error))
        self.client.close()


def hup(fleet: Fleet) -> None:
    assert fleet.proc is not None
    fleet.proc.send_signal(signal.SIGHUP)


def log_count(fleet: Fleet, text: str) -> Callable[[], int]:
    assert fleet.log_path is not None
    path = fleet.log_path
    return lambda: path.read_text().count(text)


def test_rotating_tokens_and_certificate_under_load_fails_no_push(tmp_path: Path) -> None:
    ca, ca_key = make_ca(tmp_path)
    cert_a, key_a = make_leaf(tmp_path, ca, ca_key, "a")
    cert_b, key_b = make_leaf(tmp_path, ca, ca_key, "b")
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    replace(cert, cert_a.read_bytes())
    replace(key, key_a.read_bytes())
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    old, new = "old-token-0123456789", "new-token-9876543210"
    (tokens / "node-old").write_text(old + "\n")
    node_token = tmp_path / "node-token"
    node_token.write_text(old + "\n")
    grace = 2.0
    fleet = start_fleet(
        tmp_path,
        {
            "auth": {
                "token_dir": str(tokens),
                "token_grace": f"{grace}s",
                "tls_cert": str(cert),
                "tls_key": str(key),
            }
        },
        ssl_context=ssl.create_default_context(cafile=str(ca)),
    )
    reloaded = log_count(fleet, "reloaded the TLS certificate")
    port = fleet.otlp_http.rpartition(":")[2]
    gport = fleet.otlp_grpc.rpartition(":")[2]
    pushers = [
        Pusher(
            PushConfig(
                fleet_endpoint=f"https://localhost:{port}",
                auth_token_file=str(node_token),
                ca_file=str(ca),
                push_interval=10.0,
            ),
            "http-node",
        ),
        Pusher(
            PushConfig(
                fleet_endpoint=f"localhost:{gport}",
                transport="grpc",
                auth_token_file=str(node_token),
                ca_file=str(ca),
                push_interval=10.0,
            ),
            "grpc-node",
        ),
    ]
    try:
        assert served_fingerprint(fleet.otlp_http, ca) == pem_fingerprint(cert_a)
        for p in pushers:
            p.start()
        wait_for(lambda: all(p.ok > 20 for p in pushers), what="pushes before the rotation")
        # 1. Fleet learns the new token (both valid now), then the node switches to it.
        (tokens / "node-new").write_text(new + "\n")
        hup(fleet)
        wait_for(lambda: reloaded() >= 1, what="the first reload")
        replace(node_token, (new + "\n").encode())
        # 2. The old token is removed and the certificate replaced, in one reload.
        (tokens / "node-old").unlink()
        replace(cert, cert_b.read_bytes())
        replace(key, key_b.read_bytes())
        hup(fleet)
        wait_for(lambda: reloaded() >= 2, what="the second reload")
        assert served_fingerprint(fleet.otlp_http, ca) == pem_fingerprint(cert_b)
        assert served_fingerprint(fleet.api, ca) == pem_fingerprint(cert_b)
        # 3. A reload that fails (a certificate that is not one) keeps the old material.
        replace(cert, b"not a certificate\n")
        hup(fleet)
        wait_for(log_count(fleet, "TLS reload failed"), what="the failed reload's line")
        # The grace window ends: the old token is refused; the nodes, on the new one, go on.
        fleet.token = old
        wait_for(
            lambda: fleet.push([NodePush(node_id="x", cluster_id="c", score=0.9)]).status == 401,
            timeout=grace + 30,
            what="the old token refused",
        )
        marks = [p.ok for p in pushers]
        wait_for(
            lambda: all(p.ok > m + 20 for p, m in zip(pushers, marks, strict=True)),
            what="pushes after the rotation",
        )
    finally:
        for p in pushers:
            p.halt.set()
        for p in pushers:
            p.join(timeout=30)
    try:
        assert [p.failures for p in pushers] == [[], []]
        assert served_fingerprint(fleet.otlp_http, ca) == pem_fingerprint(cert_b)
        # A new gRPC connection is served the new certificate too.
        creds = grpc.ssl_channel_credentials(ca.read_bytes())
        with grpc.secure_channel(f"localhost:{gport}", creds) as channel:
            export = channel.unary_unary(
                "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=ExportMetricsServiceResponse.FromString,
            )
            push = health_request([NodePush(node_id="g2", cluster_id="c", score=0.9)])
            export(push, timeout=10, metadata=(("authorization", f"Bearer {new}"),))
        fleet.token = new
        assert fleet.push([NodePush(node_id="x", cluster_id="c", score=0.9)]).status == 200
    finally:
        fleet.stop()


def test_token_over_its_rate_gets_429_and_fleet_push_waits_as_told(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("rate-token-0123456789\n")
    fleet = start_fleet(
        tmp_path,
        {
            "auth": {
                "bearer_token_file": str(token_file),
                "rate_limit": {"per_token": 0.5, "token_burst": 3},
            }
        },
    )
    try:
        fleet.token = "rate-token-0123456789"
        push = [NodePush(node_id="n", cluster_id="c", score=0.9)]
        statuses = [fleet.push(push) for _ in range(4)]
        assert [r.status for r in statuses] == [200, 200, 200, 429]
        assert statuses[3].headers["retry-after"] == "2"  # 1 token at 0.5/s
        # fleet-push's clients read the wait: HTTP Retry-After, gRPC RetryInfo.
        config = PushConfig(
            fleet_endpoint=f"http://{fleet.otlp_http}", auth_token_file=str(token_file)
        )
        result = make_client(config).push(health_request(push))
        assert not result.ok and result.retry_after == 2.0
        grpc_config = PushConfig(
            fleet_endpoint=fleet.otlp_grpc, transport="grpc", auth_token_file=str(token_file)
        )
        result = make_client(grpc_config).push(health_request(push))
        assert not result.ok and result.retry_after is not None
        assert 0.5 < result.retry_after <= 2.0
        assert "RESOURCE_EXHAUSTED" in str(result.error)
        # /metrics takes the same token, so it waits for the bucket to refill too
        metrics = wait_for(
            lambda: (r := fleet.request(fleet.api, "GET", "/metrics")).status == 200 and r.body,
            what="/metrics once the bucket refilled",
        )
        assert b'ingero_fleet_rejected_total{reason="rate_limited"}' in metrics
    finally:
        fleet.stop()


def test_refusals_from_one_address_are_limited(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("good-token-0123456789\n")
    fleet = start_fleet(
        tmp_path,
        {
            "auth": {
                "bearer_token_file": str(token_file),
                "rate_limit": {"refusals_per_source": 0.2, "refusal_burst": 2},
            }
        },
    )
    try:
        fleet.token = "guess"
        push = [NodePush(node_id="n", cluster_id="c", score=0.9)]
        assert [fleet.push(push).status for _ in range(3)] == [401, 401, 429]
        fleet.token = "good-token-0123456789"  # a valid token is not held back
        assert fleet.push(push).status == 200
    finally:
        fleet.stop()


def test_open_listener_without_a_token_warns_once(tmp_path: Path) -> None:
    fleet = start_fleet(tmp_path, {"listen": {"otlp_http": "0.0.0.0:0"}})
    try:
        assert fleet.log_path is not None
        lines = [
            line
            for line in fleet.log_path.read_text().splitlines()
            if "no bearer token configured" in line
        ]
        assert len(lines) == 1 and "otlp_http 0.0.0.0:" in lines[0]
        assert "otlp_grpc" not in lines[0]  # loopback listeners are not named
    finally:
        fleet.stop()
    token_file = tmp_path / "token"
    token_file.write_text("some-token-0123456789\n")
    os.makedirs(tmp_path / "b")
    fleet = start_fleet(
        tmp_path / "b",
        {"listen": {"otlp_http": "0.0.0.0:0"}, "auth": {"bearer_token_file": str(token_file)}},
    )
    try:
        assert fleet.log_path is not None
        assert "no bearer token configured" not in fleet.log_path.read_text()
    finally:
        fleet.stop()
