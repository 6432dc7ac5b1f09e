"""Zero loss: 8 producers x 10,000 events through the real forwarder, every batch sent twice
(a retry storm), and Echo killed with SIGKILL and restarted in the middle. Every event must
end up stored exactly once: an acknowledgement means committed, and a retry never doubles.
"""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from ingero.fleet.forwarder import Forwarder
from ingero.schema.events import Event

from .helpers import TOKEN_OPS, EchoProcess, straggler

pytestmark = pytest.mark.integration

PRODUCERS = 8
PER_PRODUCER = 10_000
CHUNK = 500


def count(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])
    finally:
        conn.close()


def test_every_event_is_stored_exactly_once_through_retries_and_a_crash(tmp_path: Path) -> None:
    echo = EchoProcess(tmp_path).start()
    forwarders: list[Forwarder] = []
    try:
        sent: list[list[Event]] = [
            [
                straggler(f"p{p}-n{i % 50}", "A", 1_000.0 + i, job=f"j{p}")
                for i in range(PER_PRODUCER)
            ]
            for p in range(PRODUCERS)
        ]
        for p in range(PRODUCERS):
            # half the producers speak OTLP/HTTP, half OTLP/gRPC
            endpoint = f"http://{echo.otlp_http}" if p % 2 else f"grpc://{echo.otlp_grpc}"
            forwarders.append(
                Forwarder(
                    endpoint,
                    batch_size=CHUNK,
                    backoff_initial=0.05,
                    backoff_max=0.5,
                    token=TOKEN_OPS,
                )
            )

        def produce(p: int) -> None:
            for start in range(0, PER_PRODUCER, CHUNK):
                chunk = sent[p][start : start + CHUNK]
                forwarders[p].submit(chunk)
                forwarders[p].submit(chunk)  # the storm: every batch again
                time.sleep(0.01)

        threads = [threading.Thread(target=produce, args=(p,)) for p in range(PRODUCERS)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120
        while count(echo.db) < PRODUCERS * PER_PRODUCER // 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        stored_before = count(echo.db)
        assert 0 < stored_before < PRODUCERS * PER_PRODUCER, "the crash must land mid-stream"
        assert echo.stop(signal.SIGKILL) == -signal.SIGKILL
        time.sleep(0.5)  # producers keep submitting and retrying against a dead Echo
        echo.start()
        for t in threads:
            t.join(timeout=120)
        for f in forwarders:
            assert f.flush(timeout=180), f.stats.snapshot()
        retries = sum(f.stats.retries for f in forwarders)
        for f in forwarders:
            assert f.stats.dropped_full == f.stats.dropped_rejected == 0, f.stats.snapshot()
            assert f.stats.sent == 2 * PER_PRODUCER
        assert retries > 0, "the crash should have forced retries"
    finally:
        for f in forwarders:
            f.close(timeout=1)
        echo.stop()
    conn = sqlite3.connect(f"file:{echo.db}?mode=ro", uri=True)
    try:
        ids = [row[0] for row in conn.execute("SELECT event_id FROM events")]
    finally:
        conn.close()
    expected = {e.event_id for events in sent for e in events}
    assert len(ids) == len(set(ids)) == PRODUCERS * PER_PRODUCER
    assert set(ids) == expected
