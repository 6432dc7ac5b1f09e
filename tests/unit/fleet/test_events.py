"""Fleet's event exit point: every sink gets every event; a failing sink harms no other."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Sequence
from pathlib import Path

import pytest

from ingero.fleet.events import EventQueue, JournalSink
from ingero.fleet.metrics import FleetMetrics
from ingero.runtime.journald import stderr_is_journal
from ingero.schema.events import MESSAGE_IDS, Event
from tests.unit.runtime.test_journald_wire import parse_native


def event(node: str) -> Event:
    return Event(type="straggler_state", node_id=node, cluster_id="c", timestamp=1.0)


def test_delivery_to_every_sink_despite_a_failing_one() -> None:
    metrics = FleetMetrics()
    queue = EventQueue(metrics)
    got: list[str] = []

    def broken(_events: Sequence[Event]) -> None:
        raise OSError("echo unreachable")

    queue.add_sink(broken)
    queue.add_sink(lambda events: got.extend(e.node_id for e in events), "collect")
    queue.submit([event("a"), event("b")], source="tick")
    queue.submit([event("c")], source="otlp")
    assert queue.deliver() == 3
    assert got == ["a", "b", "c"]
    assert queue.deliver() == 0  # delivered once
    text = metrics.render().decode()
    assert 'ingero_fleet_tick_listener_errors_total{listener="broken"} 1.0' in text
    assert 'ingero_fleet_events_total{source="tick",type="straggler_state"} 2.0' in text


def test_full_queue_drops_and_counts() -> None:
    metrics = FleetMetrics()
    queue = EventQueue(metrics, capacity=2)
    queue.submit([event("a"), event("b"), event("c")], source="otlp")
    assert queue.deliver() == 2
    assert "ingero_fleet_events_dropped_total 1.0" in metrics.render().decode()


def _journald(path: Path) -> socket.socket:
    """A datagram socket standing where journald's would: what Fleet writes lands here."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5)
    return sock


def test_journal_sink_writes_structured_fields_and_no_duplicate_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "journal.sock"
    with _journald(path) as journald:
        sink = JournalSink(str(path), stderr_line=False)
        drained = Event(
            type="node_drained", node_id="n3", cluster_id="c", timestamp=1.0, job_id="41"
        )
        with caplog.at_level(logging.INFO, logger="ingero.fleet.events"):
            sink([drained])
        entry = parse_native(journald.recv(65536))
        sink.close()
    assert entry["MESSAGE_ID"] == MESSAGE_IDS["node_drained"]
    assert entry["PRIORITY"] == "4" and entry["INGERO_NODE"] == "n3"
    assert entry["INGERO_EVENT_ID"] == drained.event_id
    assert caplog.records == []  # stderr is the journal: the entry is enough
    assert sink.stats() == {"sent": 1, "dropped": 0, "errors": 0}


def test_journal_sink_keeps_the_stderr_line_without_journald(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = JournalSink(str(tmp_path / "absent.sock"), stderr_line=False)
    with caplog.at_level(logging.INFO, logger="ingero.fleet.events"):
        sink([Event(type="group_degraded", node_id="", cluster_id="c", timestamp=1.0)])
    sink.close()
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "ingero group_degraded" in caplog.records[0].getMessage()
    assert sink.stats()["errors"] == 1


def test_stderr_is_journal_reads_journal_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    st = os.fstat(2)
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
    assert stderr_is_journal()
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino + 1}")
    assert not stderr_is_journal()
    monkeypatch.delenv("JOURNAL_STREAM")
    assert not stderr_is_journal()
