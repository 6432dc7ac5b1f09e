"""The two commands' failure modes (one clear line and a sysexits code, no traceback) and
SIGHUP while Echo starts."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.integration.fleet.helpers import wait_for
from tests.integration.procfs import HangupsWhileStarting

from .helpers import EchoProcess, _split, free_port, http

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
    config.write_text(f"db: {tmp_path / 'e.db'}\nauth: {{token_table: {tokens}}}\n")
    result = ingero("echo", "--config", str(config))
    assert result.returncode == 78 and "16+ characters" in result.stderr
    # The table's earlier key is read, told once that it is deprecated; both is an error.
    config.write_text(f"db: {tmp_path / 'e.db'}\nauth: {{tokens_file: {tokens}}}\n")
    result = ingero("echo", "--config", str(config))
    assert result.returncode == 78 and "16+ characters" in result.stderr
    assert "auth.tokens_file is deprecated; it is auth.token_table now" in result.stderr
    config.write_text(f"auth: {{tokens_file: {tokens}, token_table: {tokens}}}\n")
    result = ingero("echo", "--config", str(config))
    assert result.returncode == 78 and result.stderr.count("\n") == 1, result.stderr
    assert "auth.tokens_file and auth.token_table are one setting" in result.stderr
    for bad, message in [("-1", "must be 0 to 64"), ("many", "expected an integer")]:
        config.write_text(f"db: {tmp_path / 'e.db'}\nlimits: {{decode_workers: {bad}}}\n")
        result = ingero("echo", "--config", str(config))
        assert result.returncode == 78, result.stderr
        assert f"limits.decode_workers: {message}" in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("flag", "what"),
    [("--api", "the API"), ("--otlp-http", "OTLP/HTTP"), ("--otlp-grpc", "OTLP/gRPC")],
)
def test_echo_says_which_port_is_taken(tmp_path: Path, flag: str, what: str) -> None:
    import socket

    with socket.socket() as taken:
        # SO_REUSEPORT as another grpcio server's socket has it: the port is still taken
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        listen = {f: f"127.0.0.1:{free_port()}" for f in ("--api", "--otlp-http", "--otlp-grpc")}
        listen[flag] = f"127.0.0.1:{port}"
        result = ingero(
            "echo", "--db", str(tmp_path / "e.db"), *(a for kv in listen.items() for a in kv)
        )
    # one clear line and EX_UNAVAILABLE, as Fleet, for every listener (not "internal error")
    assert result.returncode == 69, result.stderr
    assert f"cannot listen for {what} on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr


def test_a_port_taken_before_echo_binds_it_moves_its_first_start_not_a_restart(
    tmp_path: Path,
) -> None:
    """The tests' ports are free when picked and can be taken before Echo binds them (this
    host is shared): a first start moves to fresh ones, a restart waits for its own."""
    echo = EchoProcess(tmp_path)
    with socket.socket() as taken:
        taken.bind(_split(echo.otlp_grpc))
        taken.listen()
        first = echo.otlp_grpc
        echo.start()
    try:
        assert echo.otlp_grpc != first and _listening(echo.otlp_grpc)
    finally:
        assert echo.stop() == 0
    refused = echo.log().count("Address already in use")
    held = socket.socket()
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the stop's TIME_WAIT
    held.bind(_split(echo.api))
    held.listen()

    def free_once_refused() -> None:  # the restart found its port taken: give it back
        wait_for(lambda: echo.log().count("Address already in use") > refused, 60, "a refusal")
        held.close()

    freer = threading.Thread(target=free_once_refused, daemon=True)
    freer.start()
    api = echo.api
    try:
        echo.start()
    finally:
        freer.join(60)
        held.close()
    try:
        assert echo.api == api and _listening(api)
    finally:
        assert echo.stop() == 0


def test_mcp_says_when_echo_cannot_be_reached() -> None:
    result = ingero("mcp", "--echo", f"http://127.0.0.1:{free_port()}")
    assert result.returncode == 69
    assert "cannot reach echo at" in result.stderr and "Traceback" not in result.stderr


def _listening(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


@pytest.mark.parametrize("attempt", range(3))
def test_sighup_while_starting_is_one_reload_once_ready(tmp_path: Path, attempt: int) -> None:
    # logrotate or `systemctl reload` racing a start: SIGHUP's default action would end Echo
    echo = EchoProcess(tmp_path)
    # Echo binds the API before it serves: not listening there means not ready.
    hangups = HangupsWhileStarting(str(tmp_path / "echo.yaml"), lambda: _listening(echo.api))
    hangups.start()
    try:
        echo.start()  # raises when Echo died of a SIGHUP
    finally:
        hangups.stop()
    try:
        assert hangups.during_start >= 1
        assert http("GET", echo.url + "/healthz")[0] == 200
        wait_for(lambda: "echo: reloaded 3 token(s)" in echo.log(), 30, "the queued reload")
        assert "SIGHUP during start-up, reloading once now that it is ready" in echo.log()
    finally:
        assert echo.stop() == 0
