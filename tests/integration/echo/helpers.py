"""Shared helpers for Echo's integration tests: events, a real daemon subprocess, HTTP."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.rpc.status_pb2 import Status

from ingero.schema.events import Event

TOKEN_OPS = "ops-token-0123456789abcdef"
TOKEN_A = "tenant-a-token-0123456789abcdef"
TOKEN_B = "tenant-b-token-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def straggler(
    node: str,
    cluster: str,
    ts: float,
    *,
    job: str = "7",
    score: float = 0.5,
    threshold: float = 0.8,
    kind: str = "straggler_state",
    **extra: Any,
) -> Event:
    return Event(
        kind,
        node,
        cluster,
        ts,
        job_id=job,
        score=score,
        threshold=threshold,
        dominant_signal="compute",
        extra=dict(extra),
    )


@dataclass
class EchoProcess:
    """``ingero echo`` as a real subprocess on free loopback ports."""

    workdir: Path
    tokens: bool = True
    tls: tuple[Path, Path] | None = None  # (cert, key)
    decode_workers: int | None = None  # None: the daemon's default
    limits: dict[str, Any] = field(default_factory=dict)  # laid over the tests' limits
    auth: dict[str, Any] = field(default_factory=dict)  # laid over the auth section
    db: Path = field(init=False)
    api: str = field(init=False)
    otlp_http: str = field(init=False)
    otlp_grpc: str = field(init=False)
    proc: subprocess.Popen[bytes] | None = None

    started: bool = False  # once: its ports are known to whoever it served

    def __post_init__(self) -> None:
        self.db = self.workdir / "echo.db"
        self._pick_ports()
        config: dict[str, Any] = {
            "db": str(self.db),
            "listen": {"api": self.api, "otlp_http": self.otlp_http, "otlp_grpc": self.otlp_grpc},
            "limits": {"max_body_bytes": 2_000_000, "sql_timeout": "1s", "sql_max_rows": 100},
            # test events are stamped near 1970; keep them
            "retention": {"max_age": "30000d"},
        }
        if self.decode_workers is not None:
            config["limits"]["decode_workers"] = self.decode_workers
        config["limits"].update(self.limits)
        if self.tokens:
            tokens = self.workdir / "tokens.yaml"
            tokens.write_text(
                json.dumps(
                    {
                        "tokens": [
                            {"name": "ops", "token": TOKEN_OPS},
                            {"name": "tenant-a", "token": TOKEN_A, "clusters": ["A"]},
                            {"name": "tenant-b", "token": TOKEN_B, "clusters": ["B"]},
                        ]
                    }
                )
            )
            config["auth"] = {"token_table": str(tokens)}
        if self.tls is not None:
            config.setdefault("auth", {}).update(
                tls_cert=str(self.tls[0]), tls_key=str(self.tls[1])
            )
        if self.auth:
            config.setdefault("auth", {}).update(self.auth)
        (self.workdir / "echo.yaml").write_text(json.dumps(config))

    def _pick_ports(self) -> None:
        self.api = f"127.0.0.1:{free_port()}"
        self.otlp_http = f"127.0.0.1:{free_port()}"
        self.otlp_grpc = f"127.0.0.1:{free_port()}"

    def _repick_ports(self) -> None:
        """Fresh ports in the configuration file, whatever else a test changed there."""
        self._pick_ports()
        path = self.workdir / "echo.yaml"
        config = json.loads(path.read_text())
        config["listen"] = {
            "api": self.api,
            "otlp_http": self.otlp_http,
            "otlp_grpc": self.otlp_grpc,
        }
        path.write_text(json.dumps(config))

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.api}"

    def start(self, keep_ports: bool = False) -> EchoProcess:
        """Starts Echo and waits until it serves. A port free when it was picked can be taken
        before Echo binds it (another test's listener or a connection's ephemeral port, this
        host is shared): Echo then exits saying so, and its first start tries fresh ports;
        a restart, or ``keep_ports`` (ports already handed out), waits for them instead."""
        for _ in range(20):
            log = self.workdir / "echo.log"
            offset = log.stat().st_size if log.exists() else 0
            try:
                self._start()
            except RuntimeError:
                said = log.read_bytes()[offset:] if log.exists() else b""
                if self.proc is None or self.proc.poll() is None:
                    raise
                if b"Address already in use" not in said:
                    raise
                if self.started or keep_ports:
                    time.sleep(0.5)
                else:
                    self._repick_ports()
                continue
            self.started = True
            return self
        raise RuntimeError(f"echo found its ports taken 20 times: {self.log()}")

    def _start(self) -> None:
        log = open(self.workdir / "echo.log", "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ingero.cli.main",
                "echo",
                "--config",
                str(self.workdir / "echo.yaml"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"echo exited {self.proc.returncode}: {self.log()}")
            try:
                # a TCP connect to every listener: the process binds them all before serving
                for address in (self.api, self.otlp_http, self.otlp_grpc):
                    with socket.create_connection(_split(address), timeout=1):
                        pass
                if self.tls is None:
                    with urllib.request.urlopen(self.url + "/healthz", timeout=1):
                        pass
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"echo did not start: {self.log()}")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code = self.proc.returncode
        self.proc = None
        return code

    def log(self) -> str:
        path = self.workdir / "echo.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def _split(hostport: str) -> tuple[str, int]:
    host, _, port = hostport.rpartition(":")
    return host, int(port)


def http(
    method: str,
    url: str,
    body: bytes | None = None,
    token: str | None = None,
    content_type: str = "application/json",
) -> tuple[int, Any]:
    """(status, parsed JSON body or raw bytes). An OTLP refusal of a protobuf request is a
    ``google.rpc.Status`` (as the OTLP spec asks): it is read into the keys the JSON one has
    (``error``, ``status``, ``code``), so a test reads a refusal the same in either encoding."""
    request = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        request.add_header("Content-Type", content_type)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, raw, ctype = (
                response.status,
                response.read(),
                response.headers.get("content-type", ""),
            )
    except urllib.error.HTTPError as exc:
        status, raw, ctype = exc.code, exc.read(), exc.headers.get("content-type", "")
    if ctype == "application/x-protobuf" and status >= 400:
        refusal = Status.FromString(raw)
        return status, {"error": refusal.message, "status": status, "code": refusal.code}
    return status, json.loads(raw) if "json" in ctype else raw
