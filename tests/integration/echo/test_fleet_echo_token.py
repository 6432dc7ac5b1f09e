"""Fleet's token for Echo rotated without a restart: ``echo.token_file`` is re-read when it
changes, so Echo can retire the old token (SIGHUP, grace window) while a real Fleet goes on
forwarding, and no event is refused or lost."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from ingero.otlp.exporter import HttpExporter
from tests.integration.fleet.helpers import start_fleet, wait_for
from tests.integration.security import refuses_token, replace

from .helpers import EchoProcess, straggler
from .test_fleet_spool import echo_ids
from .test_security import NEW, OLD, tokens_yaml

pytestmark = pytest.mark.integration

GRACE = 1.0


def test_fleet_follows_a_rotated_echo_token(tmp_path: Path) -> None:
    tokens = tmp_path / "echo-tokens.yaml"
    replace(tokens, tokens_yaml(("fleet-old", OLD)))
    (tmp_path / "echo").mkdir()
    echo = EchoProcess(
        tmp_path / "echo", auth={"token_table": str(tokens), "token_grace": f"{GRACE}s"}
    ).start()
    token_file = tmp_path / "fleet-echo-token"
    token_file.write_text(OLD + "\n")
    config = {
        "echo": {
            "endpoint": f"http://{echo.otlp_http}",
            "token_file": str(token_file),
            "score_history_interval": 0,
        }
    }
    (tmp_path / "fleet").mkdir()
    # INGERO_ECHO_TOKEN says the old token too: the file, not the environment, is used
    fleet = start_fleet(tmp_path / "fleet", config, env={"INGERO_ECHO_TOKEN": OLD})
    try:
        assert echo.proc is not None
        before = [straggler(f"before{i}", "A", 2_000.0 + i) for i in range(5)]
        assert fleet.post_logs(before).status == 200
        wait_for(lambda: {e.event_id for e in before} <= set(echo_ids(echo.db)), 30, "before")

        # Rotation: Echo takes the new token, Fleet's file gets it, Echo drops the old one.
        replace(tokens, tokens_yaml(("fleet-old", OLD), ("fleet-new", NEW)))
        echo.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: echo.log().count("reloaded 3 token(s)") >= 1, 30, "echo's reload")
        replace(token_file, (NEW + "\n").encode())
        replace(tokens, tokens_yaml(("fleet-new", NEW)))
        echo.proc.send_signal(signal.SIGHUP)
        old = HttpExporter(f"http://{echo.otlp_http}", OLD, 10.0, None, "echo")
        wait_for(lambda: refuses_token(old), GRACE + 30, "the old token refused after the grace")

        after = [straggler(f"after{i}", "A", 3_000.0 + i) for i in range(5)]
        assert fleet.post_logs(after).status == 200
        wait_for(lambda: {e.event_id for e in after} <= set(echo_ids(echo.db)), 30, "after")
        assert fleet.metric("ingero_fleet_echo_dropped_total", reason="rejected") == 0
    finally:
        fleet.stop()
        echo.stop()
