"""Fleet's durable Echo spool: appends in order, deletes only what was done, keeps the rest
across a reopen (a restart), and holds its bounds; the forwarder on top of it sends what a
previous process left, first, and keeps (never drops) what it could not deliver."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

import pytest

from ingero.fleet.forwarder import Forwarder
from ingero.fleet.spool import SPOOL_FILE, EventSpool, SpoolError
from ingero.otlp.exporter import ExportError
from ingero.schema.events import Event

from .test_forwarder import ScriptedSender


def ev(i: int) -> Event:
    return Event("straggler_state", f"n{i}", "A", 1000.0 + i, score=0.4, threshold=0.8)


SIZE = len(ev(0).to_json())  # every ev(i) below 10 has the same JSON length


@dataclass(frozen=True)
class Case:
    name: str
    max_events: int
    max_bytes: int
    appends: list[int]  # events per append call
    takes: list[int]  # batch sizes taken and done, in order, before the reopen
    accepted: list[int]  # what each append returned
    left_after_reopen: int
    first_after_reopen: int | None  # index (in append order) of the oldest event left
    refill: int = 0  # events appended after the takes, all accepted: the room came back


CASES = [
    Case("append then reopen keeps all", 100, 10**9, [3, 2], [], [3, 2], 5, 0),
    Case("done deletes only the batch taken", 100, 10**9, [5], [2], [5], 3, 2),
    Case("all done leaves nothing", 100, 10**9, [2, 2], [2, 2], [2, 2], 0, None),
    Case("event bound drops the newest", 4, 10**9, [3, 3], [], [3, 1], 4, 0),
    Case("byte bound drops the newest", 100, 3 * SIZE, [2, 2], [], [2, 1], 3, 0),
    Case("room comes back after done", 3, 10**9, [3, 2], [2], [3, 0], 3, 2, refill=2),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_spool_append_done_reopen_and_bounds(case: Case, tmp_path: Path) -> None:
    spool = EventSpool(tmp_path, case.max_events, case.max_bytes)
    events = [ev(i) for i in range(sum(case.appends))]
    refill = [ev(100 + i) for i in range(case.refill)]
    stored: list[Event] = []
    accepted = []
    start = 0
    for n in case.appends:
        got = spool.append(events[start : start + n])
        accepted.append(got)
        stored += events[start : start + got]
        start += n
    for n in case.takes:
        batch, bad = spool.take(n)
        assert bad == 0
        assert [e.event_id for e in batch] == [e.event_id for e in stored[:n]]  # oldest first
        spool.done()
        stored = stored[n:]
    assert spool.append(refill) == len(refill)
    stored += refill
    assert accepted == case.accepted
    assert len(spool) <= case.max_events and spool.size_bytes() <= case.max_bytes
    spool.close()

    reopened = EventSpool(tmp_path, case.max_events, case.max_bytes)
    assert len(reopened) == case.left_after_reopen == len(stored)
    assert reopened.size_bytes() == sum(len(e.to_json()) for e in stored)
    batch, _ = reopened.take(1000)
    assert [e.to_dict() for e in batch] == [e.to_dict() for e in stored]
    if case.first_after_reopen is not None:
        assert batch[0].event_id == events[case.first_after_reopen].event_id
    reopened.close()


def test_a_batch_taken_but_not_done_is_taken_again_after_a_restart(tmp_path: Path) -> None:
    spool = EventSpool(tmp_path, 100, 10**9)
    spool.append([ev(i) for i in range(4)])
    first, _ = spool.take(2)
    spool.close()  # as if killed while the batch was in flight
    again = EventSpool(tmp_path, 100, 10**9)
    batch, _ = again.take(2)
    assert [e.event_id for e in batch] == [e.event_id for e in first]
    again.close()


def test_a_stored_row_that_does_not_parse_is_dropped_and_counted(tmp_path: Path) -> None:
    spool = EventSpool(tmp_path, 100, 10**9)
    spool.append([ev(0)])
    spool.close()
    conn = sqlite3.connect(tmp_path / SPOOL_FILE)
    conn.execute('INSERT INTO events (body) VALUES (\'{"type": "nope"}\')')
    conn.commit()
    conn.close()
    sender = ScriptedSender()
    fwd = Forwarder(sender, spool=EventSpool(tmp_path, 100, 10**9))
    assert fwd.flush(10)
    fwd.close(1)
    assert len(sender.accepted) == 1 and fwd.stats.dropped_rejected == 1


def test_a_file_that_is_not_a_spool_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / SPOOL_FILE).write_bytes(b"not a database at all" * 100)
    with pytest.raises(SpoolError, match=SPOOL_FILE):
        EventSpool(tmp_path, 100, 10**9)


def test_forwarder_keeps_undelivered_events_and_sends_them_first_after_a_restart(
    tmp_path: Path,
) -> None:
    down = ScriptedSender([ExportError("down", True)] * 1000)
    fwd = Forwarder(
        down,
        batch_size=4,
        backoff_initial=0.01,
        backoff_max=0.02,
        spool=EventSpool(tmp_path, 100, 10**9),
    )
    old = [ev(i) for i in range(10)]
    assert fwd.submit(old) == 10
    fwd.close(timeout=0.2)
    assert fwd.stats.sent == 0 and fwd.stats.dropped_at_close == 0  # kept, not dropped

    up = ScriptedSender()
    fwd = Forwarder(up, batch_size=4, spool=EventSpool(tmp_path, 100, 10**9))
    new = [ev(i) for i in range(10, 13)]
    fwd.submit(new)
    assert fwd.flush(10)
    fwd.close(1)
    assert up.accepted == [e.event_id for e in old + new]  # the leftovers first, in order
    assert len(EventSpool(tmp_path, 100, 10**9)) == 0  # acknowledged: deleted


def test_forwarder_spool_full_drops_the_newest_and_counts_them(tmp_path: Path) -> None:
    down = ScriptedSender([ExportError("down", True)] * 1000)
    fwd = Forwarder(
        down, backoff_initial=0.01, backoff_max=0.02, spool=EventSpool(tmp_path, 5, 10**9)
    )
    assert fwd.submit([ev(i) for i in range(8)]) == 5
    assert fwd.stats.dropped_full == 3 and fwd.stats.queued == 5
    fwd.close(timeout=0.1)


def test_a_refused_spooled_batch_is_deleted_not_retried(tmp_path: Path) -> None:
    sender = ScriptedSender([ExportError("400 invalid", False)])
    fwd = Forwarder(sender, batch_size=5, spool=EventSpool(tmp_path, 100, 10**9))
    fwd.submit([ev(i) for i in range(5)])
    assert fwd.flush(10)
    fwd.submit([ev(i) for i in range(5, 7)])
    assert fwd.flush(10)
    fwd.close(1)
    assert fwd.stats.dropped_rejected == 5 and len(sender.accepted) == 2
    assert len(EventSpool(tmp_path, 100, 10**9)) == 0


def test_a_full_disk_refuses_the_append_and_keeps_what_is_stored(tmp_path: Path) -> None:
    spool = EventSpool(tmp_path, 10**6, 10**12)
    first = ev(0)
    assert spool.append([first]) == 1
    assert spool._db is not None
    pages = spool._db.execute("PRAGMA page_count").fetchone()[0]
    spool._db.execute(f"PRAGMA max_page_count={pages}")  # SQLite's own "disk is full"
    big = [ev(i) for i in range(1, 2000)]
    assert spool.append(big) == 0
    assert len(spool) == 1
    batch, _ = spool.take(10)
    assert [e.event_id for e in batch] == [first.event_id]
    spool.done()
    spool._db.execute("PRAGMA max_page_count=1073741823")
    assert spool.append(big[:5]) == 5 and len(spool) == 5
    spool.close()
