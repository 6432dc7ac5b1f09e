"""systemd notify protocol, SIGTERM, port conflicts, bearer token and TLS on every listener."""

from __future__ import annotations

import re
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
    OTLPMetricExporter as HttpMetricExporter,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)

from ingero.otlp.health import NodePush
from tests.integration.fleet.helpers import ROOT, health_request, start_fleet, wait_for
from tests.integration.fleet.test_push_paths import sdk_push
from tests.integration.procfs import HangupsWhileStarting
from tests.integration.security import make_cert
from tests.integration.signals import signal_storm

pytestmark = pytest.mark.integration


def test_notify_ready_watchdog_status_and_sigterm(tmp_path: Path) -> None:
    path = str(tmp_path / "notify.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(path)
    listener.settimeout(20)
    fleet = start_fleet(tmp_path, env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"})
    try:
        messages: list[str] = []

        def got(prefix: str) -> bool:
            while not any(m.startswith(prefix) for m in messages):
                messages.extend(listener.recv(4096).decode().split("\n"))
            return True

        assert got("READY=1")
        assert got("WATCHDOG=1")
        assert got("STATUS=0 nodes in 0 groups")
        # READY=1 comes only once every listener answers.
        assert fleet.request(fleet.api, "GET", "/healthz").status == 200
        wait_for(lambda: fleet.request(fleet.api, "GET", "/readyz").status == 200, what="ready")
        # A burst of SIGTERM and SIGINT, as a supervisor repeating its signal: one clean stop.
        assert fleet.proc is not None
        signal_storm(fleet.proc)
        assert fleet.proc.wait(timeout=30) == 0
        assert got("STOPPING=1")
    finally:
        fleet.stop()
        listener.close()
    # The storm's first signal is a SIGTERM, but on a loaded machine a SIGINT can be
    # pending beside it before the interpreter runs either handler, and CPython runs
    # pending handlers in signal-number order (SIGINT, 2, first): either may be named.
    assert re.search(r"SIG(TERM|INT) received, shutting down", fleet.log())


@pytest.mark.parametrize("flag", ["--otlp-grpc", "--otlp-http", "--api"])
def test_port_in_use_exits_69(flag: str) -> None:
    with socket.socket() as taken:
        # SO_REUSEPORT as another grpcio server's socket has it: the port is still taken
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        listen = {f: "127.0.0.1:0" for f in ("--otlp-grpc", "--otlp-http", "--api")}
        listen[flag] = f"127.0.0.1:{port}"
        result = subprocess.run(
            [sys.executable, "-m", "ingero.cli.main", "fleet"]
            + [arg for pair in listen.items() for arg in pair],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 69, result.stderr
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("ingero: ")]
    assert line.startswith("ingero: fleet: cannot listen: ") and str(port) in line, line
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr


def test_bearer_token_on_every_listener(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    fleet = start_fleet(tmp_path, {"auth": {"bearer_token_file": str(token_file)}})
    try:
        push = [NodePush(node_id="n", cluster_id="c", score=0.9)]
        assert fleet.push(push).status == 401
        fleet.token = "wrong"
        assert fleet.push(push).status == 401
        assert fleet.request(fleet.api, "GET", "/metrics").status == 401
        fleet.token = "s3cret-token"
        assert fleet.push(push).status == 200
        assert fleet.request(fleet.api, "GET", "/metrics").status == 200
        fleet.token = None
        assert fleet.request(fleet.api, "GET", "/healthz").status == 200  # probes stay open
        with grpc.insecure_channel(fleet.otlp_grpc) as channel:
            export = channel.unary_unary(
                "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=ExportMetricsServiceResponse.FromString,
            )
            with pytest.raises(grpc.RpcError) as info:
                export(health_request(push), timeout=10)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            export(
                health_request(push),
                timeout=10,
                metadata=(("authorization", "Bearer s3cret-token"),),
            )
        fleet.token = "s3cret-token"
        assert fleet.metric("ingero_fleet_rejected_total", reason="unauthorized") == 4
    finally:
        fleet.stop()


def test_tls_on_every_listener(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # requests lets these variables override an explicit CA file (psf/requests#3829).
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    cert, key = make_cert(tmp_path)
    context = ssl.create_default_context(cafile=str(cert))
    fleet = start_fleet(
        tmp_path, {"auth": {"tls_cert": str(cert), "tls_key": str(key)}}, ssl_context=context
    )
    try:
        assert fleet.push([NodePush(node_id="n", cluster_id="c", score=0.9)]).status == 200
        assert fleet.request(fleet.api, "GET", "/healthz").status == 200
        # The official exporter over HTTPS, trusting the test's CA.
        port = fleet.otlp_http.rpartition(":")[2]
        exporter = HttpMetricExporter(
            endpoint=f"https://localhost:{port}/v1/metrics", certificate_file=str(cert), timeout=30
        )
        sdk_push(exporter, "tls-node", 0.8, "c")
        credentials = grpc.ssl_channel_credentials(cert.read_bytes())
        with grpc.secure_channel(
            f"localhost:{fleet.otlp_grpc.rpartition(':')[2]}", credentials
        ) as ch:
            export = ch.unary_unary(
                "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=ExportMetricsServiceResponse.FromString,
            )
            export(health_request([NodePush(node_id="g", cluster_id="c", score=0.7)]), timeout=10)
        wait_for(lambda: fleet.metric("ingero_fleet_tracked_nodes") == 3, what="3 nodes over TLS")
        # Plaintext is refused on the TLS listener.
        fleet.ssl_context = None
        with pytest.raises((ConnectionError, OSError)):
            fleet.request(fleet.api, "GET", "/healthz")
    finally:
        fleet.stop()


@pytest.mark.parametrize("attempt", range(3))
def test_sighup_while_starting_is_one_reload_once_ready(tmp_path: Path, attempt: int) -> None:
    # logrotate or `systemctl reload` racing a start: SIGHUP's default action would end Fleet
    hangups = HangupsWhileStarting(str(tmp_path / "fleet.yaml"), (tmp_path / "ready.json").exists)
    hangups.start()
    try:
        fleet = start_fleet(tmp_path)  # raises when Fleet died of a SIGHUP
    finally:
        hangups.stop()
    try:
        assert hangups.during_start >= 1
        assert fleet.request(fleet.api, "GET", "/healthz").status == 200
        assert fleet.push([NodePush(node_id="n", cluster_id="c", score=0.9)]).status == 200
        wait_for(lambda: "fleet: reloaded 0 token(s)" in fleet.log(), 30, "the queued reload")
        assert "SIGHUP during start-up, reloading once now that it is ready" in fleet.log()
    finally:
        assert fleet.stop() == 0
