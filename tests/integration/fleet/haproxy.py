"""A real HAProxy (Debian's package) on loopback, configured from contrib/haproxy/'s own
template, started and stopped by PID."""

from __future__ import annotations

import importlib.util
import shutil
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.integration.fleet.helpers import ROOT, wait_for

BACKENDS = ("fleet_otlp_http", "fleet_otlp_grpc", "fleet_api")


def missing_reason() -> str | None:
    if shutil.which("haproxy") is None:
        return "haproxy is not installed (tests/apt-packages.txt)"
    return None


def _render_module() -> ModuleType:
    path = ROOT / "contrib" / "haproxy" / "render.py"
    spec = importlib.util.spec_from_file_location("haproxy_render", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def render(servers: list[dict[str, Any]], **settings: Any) -> str:
    text: str = _render_module().render(servers, **settings)
    return text


def example() -> tuple[str, str]:
    """(what render.py renders for the example replicas, the shipped haproxy.cfg)."""
    module = _render_module()
    rendered = module.render([module.server(s) for s in module.EXAMPLE])
    return rendered, (ROOT / "contrib" / "haproxy" / "haproxy.cfg").read_text()


@dataclass
class Haproxy:
    proc: subprocess.Popen[bytes]
    otlp_http: str
    otlp_grpc: str
    api: str
    socket_path: Path
    log_path: Path

    def command(self, line: str) -> str:
        """One runtime API command on the admin socket; its answer."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(10)
            sock.connect(str(self.socket_path))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def set_state(self, server: str, state: str) -> None:
        for backend in BACKENDS:
            answer = self.command(f"set server {backend}/{server} state {state}")
            assert answer.strip() == "", answer

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_haproxy(tmp: Path, servers: list[dict[str, Any]], ports: list[int]) -> Haproxy:
    """HAProxy on 127.0.0.1 ``ports`` (otlp_http, otlp_grpc, api) in front of ``servers``."""
    sock = tmp / "haproxy.sock"
    config = tmp / "haproxy.cfg"
    config.write_text(
        render(
            servers,
            haproxy_bind="127.0.0.1",
            haproxy_otlp_http_port=ports[0],
            haproxy_otlp_grpc_port=ports[1],
            haproxy_api_port=ports[2],
            haproxy_log="stdout format raw",
            haproxy_maxconn=1000,
            haproxy_stats_socket=str(sock),
        )
    )
    check = subprocess.run(["haproxy", "-c", "-f", str(config)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    log_path = tmp / "haproxy.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            ["haproxy", "-db", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
    try:
        wait_for(lambda: sock.exists() or proc.poll() is not None, 30, "haproxy to start")
        assert proc.poll() is None, log_path.read_text()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return Haproxy(
        proc,
        f"127.0.0.1:{ports[0]}",
        f"127.0.0.1:{ports[1]}",
        f"127.0.0.1:{ports[2]}",
        sock,
        log_path,
    )
