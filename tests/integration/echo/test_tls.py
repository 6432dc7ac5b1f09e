"""Echo with ``auth.tls_cert``/``tls_key``: every listener speaks TLS, and the forwarder
and the MCP stdio bridge reach it over https/grpcs trusting the standard CA variables."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

import anyio
import grpc
import pytest
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc

from ingero.fleet.forwarder import Forwarder
from ingero.otlp.logs import encode_events
from tests.integration.security import make_cert

from .helpers import TOKEN_OPS, EchoProcess, straggler

pytestmark = pytest.mark.integration


def count(echo: EchoProcess, context: ssl.SSLContext) -> int:
    request = urllib.request.Request(
        echo.url + "/api/v1/sql",
        data=json.dumps({"query": "SELECT count(*) FROM events"}).encode(),
        headers={"Authorization": f"Bearer {TOKEN_OPS}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, context=context, timeout=30) as response:
        return int(json.loads(response.read())["rows"][0][0])


def test_every_listener_speaks_tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = make_cert(tmp_path)
    echo = EchoProcess(tmp_path, tls=(cert, key)).start()
    try:
        context = ssl.create_default_context(cafile=str(cert))
        with urllib.request.urlopen(echo.url + "/healthz", context=context, timeout=30):
            pass
        with pytest.raises(OSError):  # plain HTTP is not answered
            urllib.request.urlopen(f"http://{echo.api}/healthz", timeout=10).close()
        # the forwarder over https, trusting the certificate through SSL_CERT_FILE
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        forwarder = Forwarder(f"https://{echo.otlp_http}", token=TOKEN_OPS)
        forwarder.submit([straggler(f"tls{i}", "A", 100.0 + i) for i in range(5)])
        assert forwarder.flush(60), forwarder.stats.snapshot()
        forwarder.close(1)
        assert forwarder.stats.sent == 5
        # gRPC with TLS, from a client that trusts the certificate
        credentials = grpc.ssl_channel_credentials(cert.read_bytes())
        with grpc.secure_channel(echo.otlp_grpc, credentials) as channel:
            stub = logs_service_pb2_grpc.LogsServiceStub(channel)  # type: ignore[no-untyped-call]
            stub.Export(
                encode_events([straggler("tls-grpc", "A", 200.0)]),
                timeout=30,
                metadata=[("authorization", f"Bearer {TOKEN_OPS}")],
            )
        # the forwarder over grpcs, in a process whose gRPC roots are the certificate
        code = (
            "import sys\nfrom ingero.fleet.forwarder import Forwarder\n"
            "from ingero.schema.events import Event\n"
            f"f = Forwarder({'grpcs://' + echo.otlp_grpc!r}, token={TOKEN_OPS!r})\n"
            "f.submit([Event('straggler_state', 'tls-grpcs', 'A', 300.0)])\n"
            "ok = f.flush(60)\nf.close(1)\nsys.exit(0 if ok and f.stats.sent == 1 else 1)\n"
        )
        env = {**os.environ, "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(cert)}
        assert subprocess.run([sys.executable, "-c", code], env=env, timeout=120).returncode == 0
        assert count(echo, context) == 7
        # the MCP stdio bridge over https
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "ingero.cli.main", "mcp", "--echo", echo.url],
            env={"INGERO_ECHO_TOKEN": TOKEN_OPS, "SSL_CERT_FILE": str(cert)},
        )

        async def ask() -> object:
            async with Client(params) as client:
                return (await client.call_tool("sql", {"query": "SELECT 1"})).structured_content

        assert anyio.run(ask) == {
            "columns": ["1"],
            "rows": [[1]],
            "row_count": 1,
            "truncated": False,
            "truncated_reason": None,
            "tables": ["events", "episodes", "scores", "nodes", "collective_episodes"],
        }
    finally:
        echo.stop()


def test_a_certificate_that_cannot_be_loaded_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    echo = EchoProcess(tmp_path, tls=(bad, bad))
    result = subprocess.run(
        [sys.executable, "-m", "ingero.cli.main", "echo", "--config", str(tmp_path / "echo.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 78, result.stderr
    assert "auth.tls_cert/tls_key: cannot load" in result.stderr
    assert not echo.db.exists()  # refused before the store was opened
