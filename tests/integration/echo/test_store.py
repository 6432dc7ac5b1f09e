"""The store on a real SQLite file: de-dup, write lock, episodes, score history, retention."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
import sqlite_utils

from ingero.echo import store as store_module
from ingero.echo.rows import INSERT_EVENT, EventRow, ScorePoint, event_row
from ingero.echo.schema import MIGRATIONS
from ingero.echo.store import Store, StoreLockedError
from ingero.push.classifier import Classifier, Observation
from ingero.push.config import ClassifierConfig
from ingero.runtime.clock import ManualClock
from ingero.runtime.errors import UnavailableError
from ingero.schema.events import Event
from ingero.sqlite.sqlitemigrate import migrate

from .helpers import straggler

pytestmark = pytest.mark.integration


def poison_row() -> EventRow:
    """A row SQLite cannot bind (a list for the extra JSON): the writer's commit fails."""
    return (*event_row(straggler("n9", "A", 98.0), 1.0)[:12], ["x"])  # type: ignore[return-value]


def count(store: Store, sql: str) -> int:
    conn = store.reader()
    try:
        return int(conn.execute(sql).fetchone()[0])
    finally:
        conn.close()


def test_a_retried_batch_is_stored_once(tmp_path: Path) -> None:
    store = Store(tmp_path / "e.db")
    try:
        batch = [straggler(f"n{i}", "A", 100.0 + i) for i in range(50)]
        assert store.write(batch) == 50
        assert store.write(batch) == 0
        assert store.write([*batch[:10], straggler("n99", "A", 200.0)]) == 1
        assert count(store, "SELECT count(*) FROM events") == 51
        assert store.stats["events_duplicate"] == 60
    finally:
        store.close()


def test_a_second_writer_is_refused_in_process_and_from_another_process(tmp_path: Path) -> None:
    db = tmp_path / "e.db"
    store = Store(db)
    try:
        with pytest.raises(StoreLockedError, match="another ingero echo"):
            Store(db)
        code = (
            "import sys\nfrom ingero.echo.store import Store, StoreLockedError\n"
            f"try:\n    Store({str(db)!r})\nexcept StoreLockedError:\n    sys.exit(3)\n"
        )
        assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 3
    finally:
        store.close()
    Store(db).close()  # released on close


def test_episodes_aggregate_time_depth_and_resolution(tmp_path: Path) -> None:
    store = Store(tmp_path / "e.db")
    try:
        store.write(
            [
                straggler("n1", "A", 100.0, score=0.6),
                straggler("n1", "A", 110.0, score=0.3),
                straggler("n1", "A", 120.0, kind="straggler_resolved", score=0.85),
                straggler("n1", "A", 200.0, score=0.7),
                straggler("n2", "A", 100.0, job="8", score=0.75),
            ]
        )
        conn = store.reader()
        rows = conn.execute(
            "SELECT node_id, job_id, start_ts, last_ts, end_ts, round(max_depth, 3), n_events"
            " FROM episodes ORDER BY node_id, start_ts"
        ).fetchall()
        conn.close()
        assert rows == [
            ("n1", "7", 100.0, 110.0, 120.0, 0.5, 3),
            ("n1", "7", 200.0, 200.0, None, 0.1, 1),
            ("n2", "8", 100.0, 100.0, None, 0.05, 1),
        ]
    finally:
        store.close()


def episode_rows(store: Store) -> list[tuple[object, ...]]:
    conn = store.reader()
    try:
        return conn.execute(
            "SELECT node_id, start_ts, last_ts, end_ts, round(max_depth, 3), n_events"
            " FROM episodes ORDER BY node_id, start_ts"
        ).fetchall()
    finally:
        conn.close()


def episode_events(node: str, event_id: str) -> list[Event]:
    """One episode as Fleet emits it: a state, a re-emit and the resolution, one event id."""
    return [
        replace(straggler(node, "A", 100.0, score=0.6), event_id=event_id),
        replace(straggler(node, "A", 110.0, score=0.3), event_id=event_id),
        replace(
            straggler(node, "A", 120.0, kind="straggler_resolved", score=0.85), event_id=event_id
        ),
    ]


@pytest.mark.parametrize(
    "order",
    [(0, 1, 2), (2, 0, 1), (2, 1, 0), (0, 2, 1), (1, 2, 0)],
    ids=["in-order", "resolved-first", "reversed", "re-emit-late", "state-last"],
)
def test_an_episode_is_the_same_whatever_order_its_events_arrive_in(
    tmp_path: Path, order: tuple[int, int, int]
) -> None:
    """Each event in its own batch, then once more after a restart (a full retry)."""
    events = episode_events("n1", str(uuid.uuid4()))
    store = Store(tmp_path / "e.db")
    try:
        for i in order:
            store.write([events[i]])
    finally:
        store.close()
    expected = [("n1", 100.0, 110.0, 120.0, 0.5, 3)]
    store = Store(tmp_path / "e.db")
    try:
        assert episode_rows(store) == expected
        assert store.write(events) == 0
        assert episode_rows(store) == expected
    finally:
        store.close()


def test_a_late_event_of_a_closed_episode_folds_into_it_after_a_restart(tmp_path: Path) -> None:
    first, reemit, resolved = episode_events("n1", str(uuid.uuid4()))
    store = Store(tmp_path / "e.db")
    try:
        store.write([first, resolved])
    finally:
        store.close()
    store = Store(tmp_path / "e.db")  # the closed episode is found again by its event id
    try:
        store.write([reemit, straggler("n1", "A", 300.0, score=0.7)])  # and a new episode
        assert episode_rows(store) == [
            ("n1", 100.0, 110.0, 120.0, 0.5, 3),
            ("n1", 300.0, 300.0, None, 0.1, 1),
        ]
    finally:
        store.close()


def test_a_retry_mixed_with_new_events_stores_and_folds_only_the_new(tmp_path: Path) -> None:
    store = Store(tmp_path / "e.db")
    try:
        old = [straggler(f"n{i}", "A", 100.0 + i, score=0.6) for i in range(5)]
        assert store.write(old) == 5
        new = [straggler(f"n{i}", "A", 200.0 + i, score=0.2) for i in range(3)]
        # the retry interleaves, and carries one new event twice
        assert store.write([old[0], new[0], old[1], new[1], new[1], old[2], new[2]]) == 3
        assert [r[5] for r in episode_rows(store)] == [2, 2, 2, 1, 1]
        assert store.stats["events_duplicate"] == 4
    finally:
        store.close()


def test_a_v1_database_is_migrated_and_keeps_de_duplicating(tmp_path: Path) -> None:
    db = tmp_path / "e.db"
    conn = sqlite3.connect(db, isolation_level=None)
    migrate(sqlite_utils.Database(conn), MIGRATIONS[:1])
    event = straggler("n1", "A", 100.0)
    conn.execute(
        "INSERT INTO events (event_id, type, cluster_id, node_id, job_id, ts, received)"
        " VALUES (?,?,?,?,?,?,?)",
        (event.event_id, event.type, "A", "n1", "7", 100.0, 100.0),
    )
    conn.execute(
        "INSERT INTO episodes (cluster_id, node_id, job_id, start_ts, last_ts, n_events)"
        " VALUES ('A', 'n1', '7', 100.0, 100.0, 1)"
    )
    conn.close()
    store = Store(db)
    try:
        assert store.write([event]) == 0
        assert store.write([straggler("n1", "A", 110.0, kind="straggler_resolved")]) == 1
        assert episode_rows(store) == [("n1", 100.0, 100.0, 110.0, None, 2)]
        assert count(store, "PRAGMA user_version") == len(MIGRATIONS)
    finally:
        store.close()


def test_a_v2_database_folds_the_nccl_events_it_holds_when_migrated(tmp_path: Path) -> None:
    db = tmp_path / "e.db"
    conn = sqlite3.connect(db, isolation_level=None)
    migrate(sqlite_utils.Database(conn), MIGRATIONS[:2])
    eid = str(uuid.uuid4())
    held = [
        Event("peer_lag", "n1", "A", ts, event_id=eid, job_id="7", extra=extra)
        for ts, extra in (
            (200.0, {"comm_rank": 3, "lag_p50_ms": 9.0, "state": "end"}),
            (100.0, {"comm_rank": 3, "lag_p50_ms": 250.0, "state": "start"}),
        )
    ]
    held.append(straggler("n1", "A", 100.0))
    conn.executemany(INSERT_EVENT, [event_row(e, 1.0) for e in held])
    conn.close()
    store = Store(db)
    try:
        reader = store.reader()
        rows = reader.execute(
            "SELECT event_id, comm_rank, start_ts, end_ts, lag_p50_ms, n_events"
            " FROM collective_episodes"
        ).fetchall()
        reader.close()
        assert rows == [(eid, 3, 100.0, 200.0, 250.0, 2)]
        assert count(store, "PRAGMA user_version") == len(MIGRATIONS) == 4
    finally:
        store.close()


def test_node_facts_change_at_once_but_last_seen_only_every_5_minutes(tmp_path: Path) -> None:
    store = Store(tmp_path / "e.db")
    try:
        store.write([straggler("n1", "A", 100.0, gpu_model="A100")])
        store.write([straggler("n1", "A", 110.0, gpu_model="H100", gpu_count=8)])
        store.write([straggler("n1", "A", 390.0)])
        conn = store.reader()
        assert conn.execute("SELECT gpu_model, gpu_count, last_seen FROM nodes").fetchall() == [
            ("H100", 8, 110.0)
        ]
        store.write([straggler("n1", "A", 410.0)])  # 5 minutes after the last write
        assert conn.execute("SELECT last_seen FROM nodes").fetchall() == [(410.0,)]
        conn.close()
    finally:
        store.close()


def test_score_history_is_downsampled_and_a_resent_sample_is_not_counted(tmp_path: Path) -> None:
    store = Store(tmp_path / "e.db", score_bucket=60.0)
    try:
        points = [
            ScorePoint("A", "n1", 600.0 + 10 * i, 0.5 + i / 100, gpu_model="H100", gpu_count=8)
            for i in range(12)
        ]
        store.write(scores=points)
        store.write(scores=points[:6])  # a retry of the first half
        conn = store.reader()
        buckets = conn.execute(
            "SELECT bucket, n, round(min, 2), round(max, 2) FROM scores ORDER BY bucket"
        ).fetchall()
        node = conn.execute("SELECT gpu_model, gpu_count, last_score_ts FROM nodes").fetchone()
        conn.close()
        assert buckets == [(600.0, 6, 0.5, 0.55), (660.0, 6, 0.56, 0.61)]
        assert node == ("H100", 8, 710.0)
    finally:
        store.close()


def test_retention_by_age_and_by_size(tmp_path: Path) -> None:
    clock = ManualClock(start=10_000.0)
    store = Store(tmp_path / "e.db", clock=clock, max_age=1000.0, retention_interval=3600)
    try:
        store.write([straggler(f"old{i}", "A", 8000.0 + i) for i in range(10)])
        store.write([straggler(f"new{i}", "A", 9500.0 + i) for i in range(10)])
        store.retain_now()  # retention also runs by itself after the first commit
        assert store.stats["retention_deleted"] == 10
        assert count(store, "SELECT count(*) FROM events WHERE node_id LIKE 'old%'") == 0
        assert count(store, "SELECT count(*) FROM events") == 10
        assert count(store, "SELECT count(*) FROM episodes") == 10
    finally:
        store.close()
    store = Store(tmp_path / "s.db", clock=clock, retention_interval=3600)
    try:
        store.write([straggler(f"n{i}", "A", 9000.0 + i, note="x" * 2000) for i in range(400)])
        size = store.used_bytes()
        store.max_bytes = size // 2
        store.retain_now()  # the writer may also start on it by itself, right after the write
        assert store.stats["retention_deleted"] > 0
        assert store.used_bytes() <= size // 2
        kept = count(store, "SELECT min(ts) FROM events")
        assert kept > 9000  # the oldest went first
    finally:
        store.close()


def test_an_episode_from_the_real_classifier_is_stored_whole(tmp_path: Path) -> None:
    """fleet-push's classifier gives an episode's events one event_id: each is still a row,
    the episode spans them, and a resend of any of them is not stored twice."""
    classifier = Classifier(
        ClassifierConfig(enter_intervals=2, exit_intervals=1, reemit_intervals=3)
    )
    events: list[Event] = []
    for i in range(12):
        score = 0.5 if 2 <= i < 10 else 0.95  # below threshold for intervals 2..9
        events += classifier.observe(
            Observation("n1", "A", 1000.0 + 5 * i, "active", score, 0.8, "fleet", job_id="7")
        )
    assert [e.type for e in events] == ["straggler_state"] * 3 + ["straggler_resolved"]
    assert len({e.event_id for e in events}) == 1
    store = Store(tmp_path / "e.db")
    try:
        assert store.write(events) == 4
        assert store.write(events) == 0  # a retry of the whole stream
        conn = store.reader()
        episode = conn.execute(
            "SELECT start_ts, last_ts, end_ts, n_events FROM episodes"
        ).fetchall()
        conn.close()
        assert episode == [(1015.0, 1045.0, 1050.0, 4)]
        assert count(store, "SELECT count(*) FROM events") == 4
    finally:
        store.close()


def test_retention_works_off_a_backlog_in_bounded_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "_RETENTION_WINDOW", 10)  # 10 rows per step
    clock = ManualClock(start=100_000.0)
    store = Store(tmp_path / "e.db", clock=clock, max_age=1000.0, retention_interval=3600)
    try:
        store.write([straggler(f"n{i}", "A", 1000.0 + i) for i in range(55)])
        store.write([straggler("fresh", "A", 99_500.0)])
        store.retain_now()
        assert store.stats["retention_deleted"] == 55
        assert count(store, "SELECT count(*) FROM events") == 1
        assert count(store, "SELECT count(*) FROM episodes") == 1
    finally:
        store.close()


def test_a_batch_that_cannot_be_written_fails_alone_and_the_writer_lives_on(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "e.db")
    try:
        unstorable = straggler("n1", "A", 100.0, lag_ms=float("nan"))  # not JSON
        with pytest.raises(ValueError, match="Out of range float"):
            store.write([straggler("n0", "A", 99.0), unstorable])
        with pytest.raises(UnavailableError, match="store write failed: Error binding"):
            store.submit(rows=[poison_row(), event_row(straggler("n0", "A", 99.0), 1.0)]).result()
        assert store.write([straggler("n2", "A", 101.0)]) == 1
        assert count(store, "SELECT count(*) FROM events") == 1  # nothing of the failed batch
        assert store.stats["commit_errors"] == 1
    finally:
        store.close()


def test_the_writer_lives_on_when_its_caches_cannot_be_reloaded_after_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(tmp_path / "e.db")
    try:
        reload = Store._load_open_episodes
        failures = iter([sqlite3.OperationalError("disk I/O error")])

        def flaky_reload(self: Store) -> None:
            failure = next(failures, None)
            if failure is not None:
                raise failure
            reload(self)

        monkeypatch.setattr(Store, "_load_open_episodes", flaky_reload)
        with pytest.raises(UnavailableError, match="store write failed"):
            store.submit(rows=[poison_row()]).result(timeout=30)
        with pytest.raises(UnavailableError, match="disk I/O error"):
            store.submit([straggler("n2", "A", 101.0)]).result(timeout=30)
        assert store.submit([straggler("n2", "A", 101.0)]).result(timeout=30) == 1
        assert store.stats["commit_errors"] == 2
    finally:
        store.close()


def test_nccl_episodes_fold_only_new_events_and_age_out(tmp_path: Path) -> None:
    """A partly retried batch folds only the events the store did not have; retention takes
    NCCL episodes that ended (or were last seen) before max_age with the other rows."""
    clock = ManualClock(start=10_000.0)
    store = Store(tmp_path / "e.db", clock=clock, max_age=1000.0, retention_interval=3600)

    def lag(ts: float, eid: str, state: str = "start") -> Event:
        extra = {"comm_hash": "ab" * 8, "comm_rank": 1, "lag_p50_ms": ts / 100, "state": state}
        return Event("peer_lag", "n1", "A", ts, event_id=eid, job_id="7", extra=extra)

    old, new = str(uuid.uuid4()), str(uuid.uuid4())
    try:
        first = [lag(8000.0, old), lag(8100.0, old, "end")]
        assert store.write(first) == 2
        # a retry of the first batch with one new event of a second episode in it
        assert store.write([*first, lag(9500.0, new)]) == 1
        assert count(store, "SELECT sum(n_events) FROM collective_episodes") == 3
        assert count(store, "SELECT count(*) FROM collective_episodes") == 2
        store.retain_now()
        conn = store.reader()
        kept = conn.execute("SELECT event_id, max_lag_p50_ms FROM collective_episodes").fetchall()
        conn.close()
        assert kept == [(new, 95.0)]
    finally:
        store.close()
