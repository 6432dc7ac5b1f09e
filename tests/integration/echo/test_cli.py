"""The two commands' failure modes: one clear line and a sysexits code, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import free_port

pytestmark = pytest.mark.integration


def ingero(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ingero.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_echo_refuses_a_bad_config_with_the_key_named(tmp_path: Path) -> None:
    config = tmp_path / "echo.yaml"
    config.write_text("listen: {api: nowhere}\n")
    result = ingero("echo", "--config", str(config))
    assert result.returncode == 78
    assert "listen.api: must be HOST:PORT" in result.stderr and "Traceback" not in result.stderr
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("tokens: [{name: x, token: short}]\n")
    config.write_text(f"db: {tmp_path / 'e.db'}\nauth: {{tokens_file: {tokens}}}\n")
    result = ingero("echo", "--config", str(config))
    assert result.returncode == 78 and "16+ characters" in result.stderr
    for bad, message in [("-1", "must be 0 to 64"), ("many", "expected an integer")]:
        config.write_text(f"db: {tmp_path / 'e.db'}\nlimits: {{decode_workers: {bad}}}\n")
        result = ingero("echo", "--config", str(config))
        assert result.returncode == 78, result.stderr
        assert f"limits.decode_workers: {message}" in result.stderr, result.stderr


def test_echo_says_which_port_is_taken(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = ingero(
            "echo",
            "--db",
            str(tmp_path / "e.db"),
            "--api",
            f"127.0.0.1:{port}",
            "--otlp-http",
            f"127.0.0.1:{free_port()}",
            "--otlp-grpc",
            f"127.0.0.1:{free_port()}",
        )
    assert result.returncode == 69
    assert f"cannot listen for the API on 127.0.0.1:{port}" in result.stderr


def test_mcp_says_when_echo_cannot_be_reached() -> None:
    result = ingero("mcp", "--echo", f"http://127.0.0.1:{free_port()}")
    assert result.returncode == 69
    assert "cannot reach echo at" in result.stderr and "Traceback" not in result.stderr
