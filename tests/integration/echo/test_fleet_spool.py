"""Fleet's Echo spool across a SIGKILL: a real ``ingero fleet`` with ``echo.spool_dir``
accepts node events (OTLP logs over HTTP) and raises its own while Echo is not running, is
killed with SIGKILL, restarted on the same spool, and once Echo starts every one of those
events is stored in Echo exactly once."""

from __future__ import annotations

import re
import signal
import sqlite3
from pathlib import Path

import pytest

from ingero.fleet.spool import SPOOL_FILE
from ingero.otlp.health import NodePush
from tests.integration.fleet.helpers import Fleet, start_fleet, wait_for
from tests.integration.fleet.test_prometheus import fetch, promtool_check

from .helpers import TOKEN_OPS, EchoProcess, straggler

pytestmark = pytest.mark.integration

REQUESTS = 20
PER_REQUEST = 25
HEALTHY = [0.90, 0.91, 0.89, 0.92, 0.90, 0.88, 0.91, 0.90]


def echo_ids(db: Path) -> list[str]:
    if not db.exists():
        return []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return [row[0] for row in conn.execute("SELECT event_id FROM events")]
    except sqlite3.OperationalError:  # Echo still creating its schema
        return []
    finally:
        conn.close()


def spooled(spool_dir: Path) -> int:
    conn = sqlite3.connect(f"file:{spool_dir / SPOOL_FILE}?mode=ro", uri=True, timeout=30)
    try:
        return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])
    finally:
        conn.close()


def fleet_raised(fleet: Fleet) -> set[str]:
    """Ids of the straggler events Fleet itself raised (its stderr line names each one)."""
    return set(re.findall(r"straggler_state: node s-1-7 .*event_id=(\S+)", fleet.log()))


def test_events_accepted_before_a_sigkill_reach_echo_once_after_the_restart(
    tmp_path: Path,
) -> None:
    (tmp_path / "echo").mkdir()
    echo = EchoProcess(tmp_path / "echo")  # ports chosen, not started: Echo is down
    spool_dir = tmp_path / "spool"
    config = {
        "echo": {
            "endpoint": f"http://{echo.otlp_http}",
            "spool_dir": str(spool_dir),
            "score_history_interval": 0,
        }
    }
    env = {"INGERO_ECHO_TOKEN": TOKEN_OPS}
    first_dir, second_dir = tmp_path / "fleet1", tmp_path / "fleet2"
    first_dir.mkdir()
    second_dir.mkdir()
    fleet = start_fleet(first_dir, config, env=env)
    restarted: Fleet | None = None
    try:
        # Fleet's own event: one straggler among eight, pushed until its episode opens.
        pushes = [
            NodePush(node_id=f"s-1-{i}", cluster_id="S", score=s, job_id="1", rank=i)
            for i, s in enumerate([*HEALTHY[:7], 0.40])
        ]
        wait_for(
            lambda: fleet.push(pushes).status == 200 and fleet_raised(fleet),
            30,
            "fleet to raise a straggler event",
        )
        raised = fleet_raised(fleet)
        sent = [
            [straggler(f"n{r}-{i}", "A", 1_000.0 + r * PER_REQUEST + i) for i in range(PER_REQUEST)]
            for r in range(REQUESTS)
        ]
        for events in sent:
            assert (
                fleet.post_logs(events).status == 200
            )  # 200: acknowledged, so the node will not resend
        # /metrics shows them waiting for Echo, in the spool (promtool-clean).
        waiting = REQUESTS * PER_REQUEST
        assert fleet.metric("ingero_fleet_echo_queued", kind="events") >= waiting
        assert fleet.metric("ingero_fleet_echo_spool_bytes") > 0
        assert fleet.metric("ingero_fleet_echo_sent_total", kind="events") == 0
        assert promtool_check(fetch(fleet.api)[2]) == ""
        # Killed right after the last 200: those events must already be on disk, not
        # waiting in memory for the next tick.
        assert fleet.proc is not None
        fleet.proc.send_signal(signal.SIGKILL)
        assert fleet.proc.wait(timeout=15) == -signal.SIGKILL
        assert (spool_dir / SPOOL_FILE).exists()

        restarted = start_fleet(second_dir, config, env=env)
        echo.start(keep_ports=True)  # Fleet was told them
        expected = {e.event_id for events in sent for e in events} | raised
        wait_for(lambda: set(echo_ids(echo.db)) >= expected, 60, "every event in echo")
        # Acknowledged batches are deleted (the restarted Fleet raised none of its own).
        wait_for(lambda: spooled(spool_dir) == 0, 30, "the spool emptied")
        wait_for(
            lambda: (
                restarted is not None
                and restarted.metric("ingero_fleet_echo_queued", kind="events") == 0
            ),
            30,
            "/metrics to show nothing waiting",
        )
        assert restarted.metric("ingero_fleet_echo_sent_total", kind="events") >= len(expected)
        assert restarted.metric("ingero_fleet_echo_spool_bytes") == 0
        ids = echo_ids(echo.db)
        mine = [i for i in ids if i in expected]
        assert len(mine) == len(set(mine)) == len(expected)  # each once
    finally:
        if fleet.proc is not None and fleet.proc.poll() is None:
            fleet.stop()
        if restarted is not None:
            restarted.stop()
        echo.stop()
