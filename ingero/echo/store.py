"""The event store: SQLite in WAL mode, written by ONE thread in batched transactions.

Receivers hand validated batches to ``submit`` (as events, or already as the rows they are
stored as, from the decoding workers); the writer thread groups whatever is
queued into one transaction and resolves each batch's future only after COMMIT, so an
acknowledgement always means the data is durable. An event is identified by
(``event_id``, ``type``, ``timestamp``), UNIQUE and inserted with OR IGNORE, so a retried
batch never doubles an event: an episode's events share one ``event_id`` (its
``straggler_state``, re-emits and ``straggler_resolved``), and each is its own row. A lock
file held with ``flock`` keeps a second Echo process from ever writing the same database.

What is stored is defined in ``ingero.echo.rows`` (an event as its row, a score sample);
straggler events are folded into the ``episodes`` table by the pure fold all readers
share (``ingero.schema.episodes``), NCCL peer-lag and hang events into ``collective_episodes``
(``ingero.echo.collectives``); this module is the writer around them: SQL, the thread,
retention.
"""

from __future__ import annotations

import collections
import concurrent.futures
import fcntl
import json
import logging
import os
import queue
import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NamedTuple

import sqlite_utils

from ingero.echo import collectives
from ingero.echo.rows import (
    CLUSTER_ID,
    DOMINANT_SIGNAL,
    EVENT_ID,
    EXTRA,
    INSERT_EVENT,
    JOB_ID,
    NODE_ID,
    SCORE,
    THRESHOLD,
    TS,
    TYPE,
    EventRow,
    ScorePoint,
    event_row,
)
from ingero.echo.schema import MIGRATIONS
from ingero.runtime.clock import Clock, SystemClock
from ingero.runtime.errors import CantCreateError, UnavailableError
from ingero.schema.episodes import RECENTLY_CLOSED, TYPES, Episode, EpisodeFold, Mark
from ingero.schema.events import Event
from ingero.sqlite.sqlitemigrate import migrate

log = logging.getLogger(__name__)

_MAX_JOBS_PER_TX = 256
_RETENTION_WINDOW = 100_000  # rows of a table one retention step looks at
_LAST_SEEN_STEP = 300.0  # seconds: how stale an event's nodes.last_seen may be
_CACHE_KIB = 64 * 1024  # the writer connection's page cache
_CHECKPOINT_PAGES = 10_000  # WAL pages between automatic checkpoints (~40 MiB)


class _NodeFacts(NamedTuple):
    """What the ``nodes`` table holds of a node from its events."""

    gpu_model: str | None
    gpu_count: int | None
    last_seen: float


def _gpu_facts(extra: str) -> tuple[str | None, int | None]:
    """The GPU model and count an event's extra fields (JSON) carry, if any."""
    fields = json.loads(extra)
    model, count = fields.get("gpu_model"), fields.get("gpu_count")
    return (
        model if isinstance(model, str) else None,
        count if isinstance(count, int) and not isinstance(count, bool) else None,
    )


@dataclass
class _Job:
    rows: Sequence[EventRow] = ()
    scores: Sequence[ScorePoint] = ()
    future: concurrent.futures.Future[int] | None = None


class StoreLockedError(UnavailableError):
    """Another process holds the database's write lock."""


def connect_readonly(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """A connection that cannot write: SQLite opens the file itself read-only."""
    uri = Path(path).resolve().as_uri() + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
    conn.execute("PRAGMA query_only = 1")
    return conn


class Store:
    """Owns the database file: the lock, the schema, the writer thread and retention."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        score_bucket: float = 60.0,
        max_age: float | None = None,
        max_bytes: int | None = None,
        retention_interval: float = 300.0,
    ) -> None:
        self.path = Path(path)
        self.clock = clock or SystemClock()
        self.score_bucket = score_bucket
        self.max_age = max_age
        self.max_bytes = max_bytes
        self.retention_interval = retention_interval
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock_file: IO[bytes] | None = _take_lock(self.path)
        except OSError as exc:
            # A missing or unwritable directory is the operator's to fix: one line, exit 73.
            raise CantCreateError(
                f"db {self.path}: cannot create: {exc.strerror or exc}"
                + (f" ({exc.filename})" if exc.filename else "")
            ) from None
        try:
            try:
                self._conn = sqlite3.connect(
                    self.path, check_same_thread=False, isolation_level=None
                )
                self._conn.execute("PRAGMA journal_mode = WAL")
            except sqlite3.OperationalError as exc:
                # e.g. db names a directory, or a file SQLite may not open for writing.
                raise CantCreateError(f"db {self.path}: cannot open for writing: {exc}") from None
            # FULL: an acknowledged batch survives power loss too; commits are batched, so
            # the fsync per commit is shared by every batch in it.
            self._conn.execute("PRAGMA synchronous = FULL")
            self._conn.execute("PRAGMA busy_timeout = 5000")
            # Batches update episodes all over their ranking index: a 64 MiB page cache
            # (default 2 MiB) keeps those pages, and checkpoints every 10,000 WAL pages
            # (default 1,000) rewrite each page less often. Measured with schema v1, whose
            # de-dup key scattered the same way: 68 -> 45 µs per event for the writer.
            self._conn.execute(f"PRAGMA cache_size = -{_CACHE_KIB}")
            self._conn.execute(f"PRAGMA wal_autocheckpoint = {_CHECKPOINT_PAGES}")
            migrate(sqlite_utils.Database(self._conn), MIGRATIONS)
            self._episodes = EpisodeFold()
            self._cache_stale = True
            # (cluster, node) -> its facts as last written
            self._node_facts: dict[tuple[str, str], _NodeFacts] = {}
            self._load_open_episodes()
        except BaseException:
            self._release_lock()
            raise
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._closed = False
        self.stats = {
            "events_stored": 0,
            "events_duplicate": 0,
            "scores_stored": 0,
            "commits": 0,
            "commit_errors": 0,
            "retention_deleted": 0,
        }
        self._next_retention = self.clock.monotonic()
        self._thread = threading.Thread(target=self._run, name="echo-writer", daemon=True)
        self._thread.start()

    # -- producers -------------------------------------------------------------------------

    def submit(
        self,
        events: Sequence[Event] = (),
        scores: Sequence[ScorePoint] = (),
        *,
        rows: Sequence[EventRow] = (),
    ) -> concurrent.futures.Future[int]:
        """Queue a batch (events, or events already made ``rows``); the future resolves to
        the number of new events once committed."""
        future: concurrent.futures.Future[int] = concurrent.futures.Future()
        if self._closed:
            future.set_exception(UnavailableError("the store is closing"))
            return future
        if events:
            now = self.clock.now()
            try:
                rows = [*rows, *(event_row(ev, now) for ev in events)]
            except ValueError as exc:  # an extra field JSON cannot hold: nothing is queued
                future.set_exception(exc)
                return future
        self._queue.put(_Job(rows, scores, future))
        return future

    def write(self, events: Sequence[Event] = (), scores: Sequence[ScorePoint] = ()) -> int:
        """Synchronous ``submit``: returns once the batch is committed."""
        return self.submit(events, scores).result()

    def close(self) -> None:
        """Commit what is queued, stop the writer and release the lock."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join()
        self._conn.close()
        self._release_lock()

    def reader(self) -> sqlite3.Connection:
        return connect_readonly(self.path)

    # -- writer thread ---------------------------------------------------------------------

    def _run(self) -> None:
        stopping = False
        while not stopping:
            # wake up for retention when it is due (at once while a backlog is worked off)
            due_in = self._next_retention - self.clock.monotonic()
            try:
                first = self._queue.get(
                    timeout=min(max(0.05, self.retention_interval / 10), max(0.0, due_in))
                )
            except queue.Empty:
                self._maybe_retain()
                continue
            jobs: list[_Job] = []
            if first is None:
                stopping = True
            else:
                jobs.append(first)
            while len(jobs) < _MAX_JOBS_PER_TX:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stopping = True
                    continue
                jobs.append(nxt)
            batches = [j for j in jobs if not isinstance(j, _RetainJob)]
            if batches:
                self._commit(batches)
            for job in jobs:
                if isinstance(job, _RetainJob) and job.future is not None:
                    try:
                        job.future.set_result(self.retain())
                    except Exception as exc:
                        job.future.set_exception(exc)
            self._maybe_retain()

    def _commit(self, jobs: list[_Job]) -> None:
        conn = self._conn
        try:
            if self._cache_stale:
                self._load_open_episodes()
            conn.execute("BEGIN IMMEDIATE")
            counts = self._apply_events(jobs)
            for job in jobs:
                for point in job.scores:
                    self._score(point)
            conn.execute("COMMIT")
        except Exception as exc:  # whatever it is, the writer lives on and senders retry
            # The caches may hold what is rolled back: reloaded before the next commit, which
            # fails in turn (and not the writer thread) while the database cannot be read.
            self._cache_stale = True
            try:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            except sqlite3.Error as rollback_exc:
                log.error("rollback failed: %s", rollback_exc)
            self.stats["commit_errors"] += 1
            log.error("commit of %d batches failed: %s", len(jobs), exc)
            for job in jobs:
                if job.future is not None:
                    job.future.set_exception(UnavailableError(f"store write failed: {exc}"))
            return
        self.stats["commits"] += 1
        for job, count in zip(jobs, counts, strict=True):
            if job.future is not None:
                job.future.set_result(count)

    def _apply_events(self, jobs: list[_Job]) -> list[int]:
        """Insert each batch's events (OR IGNORE: the unique key de-duplicates), then fold the
        new ones into episodes and node facts; returns the number of new events per batch."""
        conn = self._conn
        counts: list[int] = []
        fresh: list[EventRow] = []
        received = 0
        for job in jobs:
            if not job.rows:
                counts.append(0)
                continue
            received += len(job.rows)
            last_id = conn.execute("SELECT coalesce(max(id), 0) FROM events").fetchone()[0]
            before = conn.total_changes
            conn.executemany(INSERT_EVENT, job.rows)
            new = conn.total_changes - before
            counts.append(new)
            if new == len(job.rows):
                fresh.extend(job.rows)  # the common case: no retry, nothing to sort out
            elif new:
                # Part of a retried batch: the rows this batch added are those after last_id.
                added = collections.Counter(
                    conn.execute(
                        "SELECT ts, event_id, type FROM events WHERE id > ?", (last_id,)
                    ).fetchall()
                )
                for row in job.rows:
                    key = (row[TS], row[EVENT_ID], row[TYPE])
                    if added[key] > 0:
                        added[key] -= 1
                        fresh.append(row)
        self.stats["events_duplicate"] += received - len(fresh)
        self.stats["events_stored"] += len(fresh)
        self._fold_episodes([row for row in fresh if row[TYPE] in TYPES])
        self._conn.executemany(
            collectives.UPSERT,
            [collectives.episode_row(row) for row in fresh if row[TYPE] in collectives.TYPES],
        )
        self._touch_nodes(fresh)
        return counts

    def _load_open_episodes(self) -> None:
        """The open episode of each (cluster, node, job) and the recently closed ones by
        event id: the writer's authoritative cache, restored into the fold. Episode ids are
        handed out by the fold (one writer), so new ones insert in one go."""
        columns = (
            "id, event_id, cluster_id, node_id, job_id, start_ts, last_ts, max_depth,"
            " min_score, n_events, end_ts"
        )

        def episodes(sql: str, *args: object) -> list[Episode]:
            return [
                # v1 stored no event_id
                Episode(i, e or "", c, n, j, s, last, d, m, k, end)
                for i, e, c, n, j, s, last, d, m, k, end in self._conn.execute(sql, args)
            ]

        open_episodes = episodes(f"SELECT {columns} FROM episodes WHERE end_ts IS NULL")
        closed = episodes(
            f"SELECT {columns} FROM episodes WHERE end_ts IS NOT NULL"
            " AND event_id IS NOT NULL ORDER BY id DESC LIMIT ?",
            RECENTLY_CLOSED,
        )
        next_id = self._conn.execute("SELECT coalesce(max(id), 0) + 1 FROM episodes").fetchone()
        self._episodes = EpisodeFold(open_episodes, reversed(closed), int(next_id[0]))
        self._node_facts.clear()
        self._cache_stale = False

    def _fold_episodes(self, rows: list[EventRow]) -> None:
        """Fold straggler events into episodes (in the order they arrive; the fold sorts out
        late and early ones) and write the episodes they touched."""
        fold = self._episodes
        first_new = fold.next_id  # episodes from here on are not in the table yet
        touched: dict[int, Episode] = {}
        for row in rows:
            mark = Mark(
                row[EVENT_ID],
                row[TYPE],
                row[CLUSTER_ID],
                row[NODE_ID],
                row[JOB_ID],
                row[TS],
                row[SCORE],
                row[THRESHOLD],
                row[DOMINANT_SIGNAL],
            )
            ep = fold.add(mark)
            touched[ep.id] = ep
        inserts, updates = [], []
        for ep in touched.values():
            values = (ep.start_ts, ep.last_ts, ep.end_ts, ep.max_depth, ep.min_score, ep.n_events)
            if ep.id >= first_new:
                inserts.append((ep.id, ep.event_id, *ep.key, *values))
            else:
                updates.append((*values, ep.id))
        self._conn.executemany(
            "INSERT INTO episodes (id, event_id, cluster_id, node_id, job_id, start_ts,"
            " last_ts, end_ts, max_depth, min_score, n_events) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            inserts,
        )
        self._conn.executemany(
            "UPDATE episodes SET start_ts = ?, last_ts = ?, end_ts = ?, max_depth = ?,"
            " min_score = ?, n_events = ? WHERE id = ?",
            updates,
        )

    def _touch_nodes(self, rows: list[EventRow]) -> None:
        """Node facts from events. A node's row is rewritten only when a fact changes or
        ``last_seen`` moves on by 5 minutes: a straggling node sends an event every few."""
        known = self._node_facts
        facts: dict[tuple[str, str], _NodeFacts] = {}
        for row in rows:
            node, ts, extra = (row[CLUSTER_ID], row[NODE_ID]), row[TS], row[EXTRA]
            if extra is None or '"gpu_' not in extra:  # most events carry no GPU facts
                model = count = None
                old = known.get(node)
                if old is not None and ts < old.last_seen + _LAST_SEEN_STEP:
                    continue  # the common case: nothing to write
            else:
                model, count = _gpu_facts(extra)
            fact = facts.get(node)
            facts[node] = (
                _NodeFacts(model, count, ts)
                if fact is None
                else _NodeFacts(
                    model if model is not None else fact.gpu_model,
                    count if count is not None else fact.gpu_count,
                    max(fact.last_seen, ts),
                )
            )
        changed = []
        for node, (model, count, seen) in facts.items():
            old = known.get(node)
            if (
                old is None
                or (model is not None and model != old.gpu_model)
                or (count is not None and count != old.gpu_count)
                or seen >= old.last_seen + _LAST_SEEN_STEP
            ):
                changed.append((*node, model, count, seen))
                known[node] = _NodeFacts(
                    model if model is not None else old.gpu_model if old else None,
                    count if count is not None else old.gpu_count if old else None,
                    seen if old is None else max(seen, old.last_seen),
                )
        self._conn.executemany(
            "INSERT INTO nodes (cluster_id, node_id, gpu_model, gpu_count, last_seen)"
            " VALUES (?,?,?,?,?) ON CONFLICT (cluster_id, node_id) DO UPDATE SET"
            " gpu_model = coalesce(excluded.gpu_model, gpu_model),"
            " gpu_count = coalesce(excluded.gpu_count, gpu_count),"
            " last_seen = max(coalesce(last_seen, 0), excluded.last_seen)",
            changed,
        )

    def _score(self, p: ScorePoint) -> None:
        conn = self._conn
        self._node_facts.pop((p.cluster_id, p.node_id), None)  # this rewrites the row
        row = conn.execute(
            "SELECT last_score_ts FROM nodes WHERE cluster_id=? AND node_id=?",
            (p.cluster_id, p.node_id),
        ).fetchone()
        # A retried push re-sends the same samples: anything not newer than the last one kept
        # is a duplicate, so history is never counted twice.
        if row is not None and row[0] is not None and p.ts <= row[0]:
            return
        conn.execute(
            "INSERT INTO nodes (cluster_id, node_id, host_name, gpu_model, gpu_count, provider,"
            " last_score, last_score_ts, last_seen) VALUES (?,?,?,?,?,?,?,?,?)"
            " ON CONFLICT (cluster_id, node_id) DO UPDATE SET"
            " host_name = coalesce(excluded.host_name, host_name),"
            " gpu_model = coalesce(excluded.gpu_model, gpu_model),"
            " gpu_count = coalesce(excluded.gpu_count, gpu_count),"
            " provider = coalesce(excluded.provider, provider),"
            " last_score = excluded.last_score, last_score_ts = excluded.last_score_ts,"
            " last_seen = max(coalesce(last_seen, 0), excluded.last_seen)",
            (
                p.cluster_id,
                p.node_id,
                p.host_name,
                p.gpu_model,
                p.gpu_count,
                p.provider,
                p.score,
                p.ts,
                p.ts,
            ),
        )
        bucket = p.ts - (p.ts % self.score_bucket)
        conn.execute(
            "INSERT INTO scores (cluster_id, node_id, bucket, job_id, n, sum, min, max)"
            " VALUES (?,?,?,?,1,?,?,?) ON CONFLICT (cluster_id, node_id, bucket) DO UPDATE SET"
            " n = n + 1, sum = sum + excluded.sum, min = min(min, excluded.min),"
            " max = max(max, excluded.max), job_id = coalesce(excluded.job_id, job_id)",
            (p.cluster_id, p.node_id, bucket, p.job_id, p.score, p.score, p.score),
        )
        self.stats["scores_stored"] += 1

    # -- retention -------------------------------------------------------------------------

    def _maybe_retain(self) -> None:
        now = self.clock.monotonic()
        if now < self._next_retention:
            return
        try:
            more = self._retain_step()[1]
        except Exception as exc:
            log.error("retention failed: %s", exc)
            more = False
        # A backlog is worked off one bounded transaction at a time, between ingest batches,
        # so acknowledgements are never held up behind one huge DELETE.
        self._next_retention = now if more else now + self.retention_interval

    def retain(self) -> int:
        """Delete what is older than ``max_age``, then the oldest events while over
        ``max_bytes``; returns the events deleted. Writer thread only (see ``retain_now``)."""
        deleted = 0
        while True:
            count, more = self._retain_step()
            deleted += count
            if not more:
                return deleted

    def _retain_step(self) -> tuple[int, bool]:
        """One bounded retention transaction: (events deleted, whether more is due).

        It works from the oldest stored rows forward (insertion order, ``_RETENTION_WINDOW``
        rows of each table at a time), so it never scans or sorts a whole table; a row that
        arrived late with an old timestamp goes once the rows stored before it have gone."""
        conn = self._conn
        events = episodes = scores = 0
        with _tx(conn):
            if self.max_age is not None:
                cutoff = self.clock.now() - self.max_age
                events, episodes, scores = self._delete_before(cutoff, None)
            if self.max_bytes is not None and self.used_bytes() > self.max_bytes:
                # about a tenth of the events per step (ids estimate the count for free)
                lo, hi = conn.execute("SELECT min(id), max(id) FROM events").fetchone()
                chunk = min(_RETENTION_WINDOW // 5, max(1, (hi - lo + 1) // 10)) if hi else 1
                newest = conn.execute(
                    "SELECT max(id), max(ts) FROM (SELECT id, ts FROM events ORDER BY id LIMIT ?)",
                    (chunk,),
                ).fetchone()
                if newest[0] is not None:
                    e, p, c = self._delete_before(newest[1], newest[0])
                    events, episodes, scores = events + e, episodes + p, scores + c
        if episodes:
            self._load_open_episodes()  # stale open episodes may have gone
        self.stats["retention_deleted"] += events
        more = bool(events or episodes or scores)
        return events, more

    def _delete_before(self, cutoff: float, max_event_id: int | None) -> tuple[int, int, int]:
        """Delete, among the oldest stored rows, events (with id <= ``max_event_id`` if given,
        else older than ``cutoff``), and episodes and score buckets older than ``cutoff``;
        returns (events, episodes, score buckets and NCCL episodes) deleted."""
        conn = self._conn
        n = _RETENTION_WINDOW
        if max_event_id is not None:
            events = conn.execute("DELETE FROM events WHERE id <= ?", (max_event_id,)).rowcount
        else:
            events = conn.execute(
                "DELETE FROM events WHERE id IN (SELECT id FROM"
                " (SELECT id, ts FROM events ORDER BY id LIMIT ?) WHERE ts < ?)",
                (n, cutoff),
            ).rowcount
        episodes = conn.execute(
            "DELETE FROM episodes WHERE id IN (SELECT id FROM (SELECT id, end_ts, last_ts"
            " FROM episodes ORDER BY id LIMIT ?) WHERE coalesce(end_ts, last_ts) <= ?)",
            (n, cutoff),
        ).rowcount
        # NCCL episodes count with the score buckets: deleting them asks for no reload of
        # the straggler fold, and a step that deleted some does more.
        scores = conn.execute(
            "DELETE FROM collective_episodes WHERE id IN (SELECT id FROM (SELECT id, end_ts,"
            " last_ts FROM collective_episodes ORDER BY id LIMIT ?)"
            " WHERE coalesce(end_ts, last_ts) <= ?)",
            (n, cutoff),
        ).rowcount
        scores += conn.execute(
            "DELETE FROM scores WHERE rowid IN (SELECT rowid FROM"
            " (SELECT rowid, bucket FROM scores ORDER BY rowid LIMIT ?) WHERE bucket < ?)",
            (n, cutoff),
        ).rowcount
        return events, episodes, scores

    def retain_now(self) -> int:
        """Run retention on the writer thread and wait for it (for tests and the CLI)."""
        done: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._queue.put(_RetainJob(done))
        return done.result()

    def used_bytes(self) -> int:
        page_size, pages, free = (
            self._conn.execute(f"PRAGMA {p}").fetchone()[0]
            for p in ("page_size", "page_count", "freelist_count")
        )
        return int(page_size) * (int(pages) - int(free))

    def _release_lock(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None


class _RetainJob(_Job):
    def __init__(self, future: concurrent.futures.Future[int]) -> None:
        super().__init__((), (), future)


class _tx:
    """``BEGIN IMMEDIATE`` … ``COMMIT`` (or ROLLBACK) on an autocommit connection."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self.conn.execute("ROLLBACK" if exc_type else "COMMIT")


def _take_lock(db_path: Path) -> IO[bytes]:
    lock_path = db_path.with_name(db_path.name + ".lock")
    handle = open(lock_path, "ab")  # noqa: SIM115 - held for the life of the Store
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise StoreLockedError(
            f"{db_path}: another ingero echo is already writing this database"
        ) from None
    return handle
