"""What every daemon's command line shares: --print-config as JSON, one verbosity option,
and the sysexits codes for an address or file it cannot get (each CLI run as a process)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ingero.runtime.errors import EXIT_CANTCREAT, EXIT_UNAVAILABLE

# fleet, fleet-push and echo share ingero.runtime.config's loader, so they share --print-config.
CONFIGURED = ["fleet", "fleet-push", "echo"]


def ingero(*args: str) -> subprocess.CompletedProcess[str]:
    # INGERO_CONFIG="" so a host's /etc/ingero/*.yaml does not leak into the test.
    return subprocess.run(
        [sys.executable, "-m", "ingero.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "INGERO_CONFIG": ""},
    )


@pytest.mark.parametrize("daemon", CONFIGURED)
def test_print_config_is_json_that_loads_back_as_a_config_file(daemon: str, tmp_path: Path) -> None:
    config = tmp_path / f"{daemon}.yaml"
    config.write_text("push_interval: 7s\n" if daemon != "echo" else "db: /tmp/x.db\n")
    shown = ingero(daemon, "--config", str(config), "--print-config")
    assert shown.returncode == 0, shown.stderr
    # JSON, as fleet-push and echo always printed it (scripts parse it), and so YAML too
    effective = json.loads(shown.stdout)
    assert isinstance(effective, dict) and yaml.safe_load(shown.stdout) == effective
    if daemon == "echo":
        assert effective["db"] == "/tmp/x.db"
    else:
        assert effective["push_interval"] == 7.0
    # The printout is itself a valid configuration that gives the same effective values.
    config.write_text(shown.stdout)
    again = ingero(daemon, "--config", str(config), "--print-config")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == effective


@pytest.mark.parametrize("daemon", [*CONFIGURED, "sink"])
def test_every_daemon_takes_the_same_verbosity_option(daemon: str) -> None:
    text = ingero(daemon, "--help").stdout
    assert "--log-level [debug|info|warning|error]" in text and "-v, --verbose" in text
    bad = ingero(daemon, "--log-level", "chatty")
    assert bad.returncode == 2 and "--log-level" in bad.stderr
    if daemon in CONFIGURED:  # accepted (both spellings) before anything starts
        for flags in (["--log-level", "DEBUG"], ["-v"], ["--log-level", "error"]):
            ok = ingero(daemon, *flags, "--print-config")
            assert ok.returncode == 0, (flags, ok.stderr)


def test_sink_on_a_busy_port_exits_69_like_fleet(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = ingero(
            "sink", "-v", "--socket", str(tmp_path / "s.sock"), "--metrics", f"127.0.0.1:{port}"
        )
    assert result.returncode == EXIT_UNAVAILABLE, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"cannot listen on 127.0.0.1:{port}" in lines[0]


def test_sink_on_an_unusable_socket_path_exits_69(tmp_path: Path) -> None:
    result = ingero("sink", "--socket", "/dev/null/s.sock", "--metrics", "")
    assert result.returncode == EXIT_UNAVAILABLE, result.stderr
    assert result.stderr.count("\n") == 1 and "cannot listen on /dev/null/s.sock" in result.stderr


@pytest.mark.parametrize("where", ["/proc/no-such-dir/echo.db", "/dev/null/echo.db", "DIR"])
def test_echo_with_a_db_directory_it_cannot_create_exits_73(where: str, tmp_path: Path) -> None:
    if where == "DIR":  # the db path is a directory: SQLite cannot open it
        where = str(tmp_path / "is-a-dir.db")
        Path(where).mkdir()
    result = ingero(
        "echo", "--db", where, "--api", "127.0.0.1:0", "--otlp-http", "127.0.0.1:0",
        "--otlp-grpc", "127.0.0.1:0",
    )  # fmt: skip
    assert result.returncode == EXIT_CANTCREAT, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and where in lines[0] and "cannot " in lines[0], lines
    assert "internal error" not in result.stderr


@pytest.mark.parametrize(("flags", "info_shown"), [([], True), (["--log-level", "warning"], False)])
def test_log_level_sets_what_a_running_daemon_writes(
    tmp_path: Path, flags: list[str], info_shown: bool
) -> None:
    """Fleet as a process: its INFO start-up lines appear at the default level only."""
    ready = tmp_path / "ready.json"
    argv = [sys.executable, "-m", "ingero.cli.main", "fleet", *flags, "--ready-file", str(ready)]
    for name in ("--otlp-grpc", "--otlp-http", "--api"):
        argv += [name, "127.0.0.1:0"]
    log = tmp_path / "fleet.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "INGERO_CONFIG": ""}
        )
    try:
        for _ in range(600):  # up to 60 s for the listeners
            if ready.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert ready.exists(), log.read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert ("INFO " in log.read_text()) is info_shown, log.read_text()


def test_fleet_push_service_from_the_flag_the_environment_and_the_file(tmp_path: Path) -> None:
    config = tmp_path / "push.yaml"
    config.write_text("service: from-file\ninference: {metrics_timeout: 2s}\n")

    def shown(*flags: str, env: str | None = None) -> object:
        result = subprocess.run(
            [sys.executable, "-m", "ingero.cli.main", "fleet-push", *flags, "--print-config"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "INGERO_CONFIG": "", "INGERO_SERVICE": env or ""},
        )
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)["service"]

    assert shown() is None
    assert shown(env="from-env") == "from-env"
    assert shown("--config", str(config)) == "from-file"
    assert shown("--config", str(config), "--service", "from-flag") == "from-flag"
    effective = ingero("fleet-push", "--config", str(config), "--print-config")
    assert json.loads(effective.stdout)["inference"]["metrics_timeout"] == 2.0
    config.write_text("inference: {max_metrics_bytes: 10}\n")
    refused = ingero("fleet-push", "--config", str(config), "--print-config")
    assert refused.returncode == 78 and "max_metrics_bytes" in refused.stderr
