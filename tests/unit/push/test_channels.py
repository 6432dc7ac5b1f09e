"""Queued channels: a slow or absent consumer never blocks the sender; drops are counted."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from ingero.push.channels.otlp import OtlpLogsChannel
from ingero.push.channels.uds import UdsChannel
from ingero.schema.events import Event


def event(i: int = 0) -> Event:
    return Event(type="straggler_state", node_id=f"n{i}", cluster_id="c", timestamp=float(i))


def read_lines(conn: socket.socket, n: int) -> list[bytes]:
    buf = b""
    while buf.count(b"\n") < n:
        chunk = conn.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf.splitlines()


def test_absent_consumer_queue_bounded_drops_counted_then_delivered(tmp_path: Path) -> None:
    path = str(tmp_path / "ev.sock")
    channel = UdsChannel(path, queue_size=10)
    try:
        for i in range(50):
            channel.send(event(i))  # returns at once: nobody listens
        stats = channel.stats()
        assert stats["dropped"] >= 39  # the sender thread may hold one event in hand
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(1)
        conn, _ = server.accept()
        lines = read_lines(conn, 50 - stats["dropped"])
        got = [Event.from_dict(json.loads(line)) for line in lines]
        assert len(got) == 50 - stats["dropped"]
        assert got[0].node_id == "n0"
        conn.close()
        server.close()
    finally:
        channel.close()


def test_stalled_consumer_never_blocks_send(tmp_path: Path) -> None:
    """A consumer that accepts and never reads: the socket buffer fills, send() still returns."""
    path = str(tmp_path / "ev.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    channel = UdsChannel(path, queue_size=100, send_timeout=30.0)
    try:
        big = Event(
            type="straggler_state",
            node_id="n",
            cluster_id="c",
            timestamp=0.0,
            extra={"pad": "x" * 60000},
        )
        for _ in range(2000):
            channel.send(big)
        stats = channel.stats()
        # ~a few socket buffers got through; the bounded queue holds 100; the rest dropped.
        assert stats["dropped"] >= 2000 - 100 - 50
        assert stats["queued"] <= 100
    finally:
        server.close()
        channel.close(timeout=0.1)


def test_close_counts_what_was_left(tmp_path: Path) -> None:
    channel = UdsChannel(str(tmp_path / "none.sock"), queue_size=5)
    for i in range(5):
        channel.send(event(i))
    channel.close(timeout=0.1)
    stats = channel.stats()
    assert stats["sent"] == 0
    assert stats["dropped"] == 5


def test_otlp_channel_retries_oserror_and_drops_rejected() -> None:
    calls: list[ExportLogsServiceRequest] = []
    gate = threading.Event()
    failures = iter([OSError("down"), None, ValueError("rejected")])

    def exporter(request: ExportLogsServiceRequest) -> None:
        calls.append(request)
        outcome = next(failures, None)
        if outcome is not None:
            raise outcome
        gate.set()

    channel = OtlpLogsChannel(exporter, {"ingero.node.id": "n0"}, retry_delay=0.01)
    try:
        channel.send(event(1))
        assert gate.wait(10)
        channel.send(event(2))
        channel.close(timeout=10)
    finally:
        channel.close()
    stats = channel.stats()
    assert stats["sent"] == 1 and stats["errors"] == 1 and stats["dropped"] == 1
    record = calls[0].resource_logs[0].scope_logs[0].log_records[0]
    assert record.event_name == "ingero.straggler_state"
