"""A real ``ingero fleet`` with ``echo.endpoint`` set forwards events to a real Echo,
keeps retrying while Echo is down, and a resent event is stored once."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from ingero.schema.events import Event
from tests.integration.fleet.helpers import Fleet, start_fleet, wait_for

from .helpers import TOKEN_OPS, EchoProcess

pytestmark = pytest.mark.integration


def stored(db: Path, event_id: str) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return int(
            conn.execute("SELECT count(*) FROM events WHERE event_id = ?", (event_id,)).fetchone()[
                0
            ]
        )
    finally:
        conn.close()


def push_event(fleet: Fleet, event: Event) -> None:
    assert fleet.post_logs([event]).status == 200


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_fleet_forwards_events_to_echo_through_an_outage(tmp_path: Path, transport: str) -> None:
    (tmp_path / "echo").mkdir(exist_ok=True)
    echo = EchoProcess(tmp_path / "echo").start()
    endpoint = f"http://{echo.otlp_http}" if transport == "http" else f"grpc://{echo.otlp_grpc}"
    fleet_dir = tmp_path / "fleet"
    fleet_dir.mkdir()
    fleet = start_fleet(
        fleet_dir, {"echo": {"endpoint": endpoint}}, env={"INGERO_ECHO_TOKEN": TOKEN_OPS}
    )
    try:
        first = Event("straggler_state", "n1", "A", 1.7e9, score=0.4, threshold=0.8)
        push_event(fleet, first)
        push_event(fleet, first)  # the same event twice (a node's retry)
        wait_for(lambda: stored(echo.db, first.event_id) == 1, 30, "the event in echo")
        echo.stop()
        second = Event("straggler_resolved", "n1", "A", 1.7e9 + 60, score=0.9, threshold=0.8)
        push_event(fleet, second)
        echo.start()
        wait_for(lambda: stored(echo.db, second.event_id) == 1, 60, "the event sent in the outage")
        assert stored(echo.db, first.event_id) == 1
    finally:
        fleet.stop()
        echo.stop()
