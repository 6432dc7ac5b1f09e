"""The node DB's one writer: every row ingero writes to a node DB is written here.

:class:`NodeDbWriter` (``ingero trace``, ``ingero annotate``, ``ingero gpu-sample``): one
thread owns the connection (WAL), writes batches, bounds the size. Everything the tracer
produces in one interval is one batch, written in one transaction. When the live data
(pages in use, not the file length: freed pages are reused) exceeds ``max_bytes``, the
oldest rows of every table are deleted until it fits again.

:func:`record_engines` (``ingero fleet-push``): the node's inference servers, into a node
DB the tracer made (it never creates or migrates one). :func:`insert_batch`,
:func:`replace_process` and :func:`delete_before`: the synthetic workload's writes
(``ingero workload``), in its own transactions.
"""

from __future__ import annotations

import queue
import sqlite3
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import sqlite_utils

from ingero.nodedb.schema import connect

# Tables pruned by age, with their time column.
_AGED = (("raw_events", "ts"), ("intervals", "ts_end"), ("host_intervals", "ts_end"),
         ("gpu_intervals", "ts_end"), ("gpu_processes", "ts_end"),
         ("processes", "last_seen"), ("nccl_calls", "ts_enter"),
         ("nccl_comms", "ts"), ("stacks", "last_seen"), ("marks", "ts_start"),
         ("stream_intervals", "ts_end"))  # fmt: skip
_INSERTED = ("intervals", "raw_events", "host_intervals", "gpu_intervals", "gpu_processes",
             "nccl_calls", "nccl_comms", "marks", "stream_intervals")  # fmt: skip
PRUNE_FRACTION = 0.1
# Batches kept for retry after a failed write (locked or full DB) before the oldest is dropped.
MAX_RETRY = 100
# An error line names the row's fault, never the whole row (a hostile one may be long).
MAX_ERROR_CHARS = 300


@dataclass
class Batch:
    intervals: Sequence[dict[str, object]] = ()
    raw_events: Sequence[dict[str, object]] = ()
    host_intervals: Sequence[dict[str, object]] = ()
    processes: Sequence[dict[str, object]] = ()
    gpu_intervals: Sequence[dict[str, object]] = ()
    gpu_processes: Sequence[dict[str, object]] = ()
    nccl_calls: Sequence[dict[str, object]] = ()
    nccl_comms: Sequence[dict[str, object]] = ()
    # Distinct stacks the batch's rows refer to: stack_key, frames (JSON), first/last_seen.
    stacks: Sequence[dict[str, object]] = ()
    # ``ingero annotate``: the job's marks, and the ends of phases whose begin an earlier
    # batch wrote (pid, name, ts_start, ts_end).
    marks: Sequence[dict[str, object]] = ()
    mark_ends: Sequence[dict[str, object]] = ()
    # Collectives an earlier batch wrote in flight (ts_return NULL) that returned since:
    # pid, comm_hash, seq, ts_enter (the row), ts_return, ret.
    nccl_returns: Sequence[dict[str, object]] = ()
    # Per (pid, stream): syncs, launches and sync-to-sync steps of the interval.
    stream_intervals: Sequence[dict[str, object]] = ()


@dataclass
class WriterStats:
    batches: int = 0
    rows: int = 0
    errors: int = 0
    bad_rows: int = 0  # rows no write could store, dropped (their batch's others written)
    last_error: str | None = None


def _merged(batches: Sequence[Batch]) -> dict[str, list[dict[str, object]]]:
    """The rows of ``batches`` as one Batch's fields."""
    out: dict[str, list[dict[str, object]]] = {}
    for batch in batches:
        for f in fields(Batch):
            out.setdefault(f.name, []).extend(getattr(batch, f.name))
    return out


def used_bytes(db: sqlite_utils.Database) -> int:
    """Bytes of pages holding data (excludes the free list SQLite reuses)."""
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    free = db.execute("PRAGMA freelist_count").fetchone()[0]
    size = db.execute("PRAGMA page_size").fetchone()[0]
    return int((pages - free) * size)


def write_batch(db: sqlite_utils.Database, batch: Batch) -> int:
    """Insert one batch in one transaction; returns the number of rows written."""
    # atomic(), not ``with db.conn``: sqlite-utils' insert_all commits its own transaction
    # when none is open, so a batch failing half-way kept its first tables (and a retry
    # wrote them twice). Inside atomic() its inserts are savepoints of this one.
    with db.atomic():
        return insert_batch(db, batch)


def insert_batch(db: sqlite_utils.Database, batch: Batch) -> int:
    """Insert one batch in the caller's transaction; returns the number of rows written."""
    n = 0
    for table in _INSERTED:
        rows = list(getattr(batch, table))
        if rows:
            db.table(table).insert_all(rows)
            n += len(rows)
    if batch.processes:
        db.conn.executemany(
            "INSERT INTO processes (pid, comm, exe, job_id, rank, first_seen, last_seen) "
            "VALUES (:pid, :comm, :exe, :job_id, :rank, :first_seen, :last_seen) "
            "ON CONFLICT(pid) DO UPDATE SET last_seen = excluded.last_seen, "
            "job_id = COALESCE(excluded.job_id, job_id), "
            "rank = COALESCE(excluded.rank, rank)",
            list(batch.processes),
        )
        n += len(batch.processes)
    if batch.stacks:
        db.conn.executemany(
            "INSERT INTO stacks (stack_key, frames, first_seen, last_seen) "
            "VALUES (:stack_key, :frames, :first_seen, :last_seen) "
            "ON CONFLICT(stack_key) DO UPDATE SET "
            "last_seen = MAX(last_seen, excluded.last_seen)",
            list(batch.stacks),
        )
        n += len(batch.stacks)
    if batch.mark_ends:
        db.conn.executemany(
            "UPDATE marks SET ts_end = :ts_end WHERE pid = :pid AND kind = 'phase' "
            "AND name = :name AND ts_start = :ts_start AND ts_end IS NULL",
            list(batch.mark_ends),
        )
        n += len(batch.mark_ends)
    if batch.nccl_returns:
        # (comm_hash, seq) is indexed; pid and the arrival time pin the one row.
        db.conn.executemany(
            "UPDATE nccl_calls SET ts_return = :ts_return, ret = :ret "
            "WHERE comm_hash = :comm_hash AND seq = :seq AND pid = :pid "
            "AND ts_enter = :ts_enter AND ts_return IS NULL",
            list(batch.nccl_returns),
        )
        n += len(batch.nccl_returns)
    return n


def prune(db: sqlite_utils.Database, max_bytes: int) -> int:
    """Delete the oldest rows (all tables, by time) until the data fits; returns rows deleted."""
    deleted = 0
    while used_bytes(db) > max_bytes:
        lo, hi = None, None
        for table, col in _AGED:
            row = db.execute(f"SELECT MIN({col}), MAX({col}) FROM {table}").fetchone()
            if row[0] is not None:
                lo = row[0] if lo is None else min(lo, row[0])
                hi = row[1] if hi is None else max(hi, row[1])
        if lo is None or hi is None:
            break
        cutoff = lo + max((hi - lo) * PRUNE_FRACTION, 1e-6)
        step = 0
        with db.conn:
            for table, col in _AGED:
                step += db.conn.execute(f"DELETE FROM {table} WHERE {col} < ?", (cutoff,)).rowcount
        deleted += step
        if step == 0 and cutoff > hi:
            break
    return deleted


def single_rows(batch: Batch) -> Iterator[Batch]:
    """``batch`` as batches of one row each, in the order ``write_batch`` writes them (marks
    before the phase ends that update them, collectives before their returns)."""
    for f in fields(Batch):
        for row in getattr(batch, f.name):
            yield Batch(**{f.name: [row]})


class NodeDbWriter:
    """Owns the node DB connection on a thread; ``submit`` never blocks the tracer."""

    def __init__(
        self,
        path: str | Path,
        max_bytes: int | None = None,
        max_pending: int = 1000,
        command: str = "ingero trace",
    ):
        self.path = Path(path)
        self.command = command  # who a write error names on stderr
        self.max_bytes = max_bytes
        self.stats = WriterStats()
        self._queue: queue.Queue[Batch | None] = queue.Queue(maxsize=max_pending)
        self._retry: list[Batch] = []
        self._thread = threading.Thread(target=self._run, name="ingero-db-writer", daemon=True)
        # Open (and migrate) here so a bad path fails the command at start, not on a thread.
        self._db = connect(self.path)

    def start(self) -> None:
        self._thread.start()

    def submit(self, batch: Batch) -> bool:
        """Queue a batch; False (and counted as an error) when the writer is far behind."""
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self.stats.errors += 1
            self.stats.last_error = "writer queue full: batch dropped"
            return False
        return True

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, then close the connection."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout)
        else:
            self._drain()
        self._db.conn.close()

    def _write_rows(self, batch: Batch, first: Exception) -> None:
        """Write ``batch`` a row at a time, dropping (and counting) the rows that fail; a
        row that meets a busy or full DB is kept, with those after it, for the next write."""
        rows = list(single_rows(batch))
        bad = 0
        for i, row in enumerate(rows):
            try:
                self.stats.rows += write_batch(self._db, row)
            except sqlite3.OperationalError:
                self._retry.append(Batch(**_merged(rows[i:])))
                break
            except Exception:
                bad += 1
        self.stats.batches += 1
        self.stats.bad_rows += bad
        self._failed(f"node DB: {bad} row(s) dropped: {type(first).__name__}: {first}")

    def _drain(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                self._write(item)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                self._drain()
                return
            try:
                self._write(item)
            except Exception as exc:  # the thread must outlive anything one batch raises
                self._failed(f"node DB write failed ({type(exc).__name__}): {exc}")

    def _failed(self, message: str) -> None:
        self.stats.errors += 1
        self.stats.last_error = f"{self.path}: {message}"[:MAX_ERROR_CHARS]
        print(f"{self.command}: {message}"[:MAX_ERROR_CHARS], file=sys.stderr)

    def _write(self, batch: Batch) -> None:
        pending, self._retry = [*self._retry, batch], []
        for i, item in enumerate(pending):
            try:
                self.stats.rows += write_batch(self._db, item)
                self.stats.batches += 1
            except sqlite3.OperationalError as exc:
                # A full disk or a locked DB must not stop tracing: keep the batches for the
                # next write, dropping the oldest only past MAX_RETRY.
                self._failed(f"node DB write failed: {exc}")
                self._retry = [*self._retry, *pending[i:]][-MAX_RETRY:]
                return
            except Exception as exc:
                # A row the DB cannot take (a string SQLite cannot encode, an integer past 64
                # bits, a required column missing) fails its whole transaction, now and on
                # every retry: the batch's other rows are written one by one instead.
                self._write_rows(item, exc)
        if self.max_bytes is not None:
            try:
                prune(self._db, self.max_bytes)
            except sqlite3.Error as exc:
                self.stats.errors += 1
                self.stats.last_error = f"{self.path}: prune: {exc}"


def replace_process(db: sqlite_utils.Database, row: dict[str, object]) -> None:
    """Write one ``processes`` row whole (keyed by pid): the synthetic workload's process,
    which a run on the same DB starts afresh."""
    db.table("processes").upsert(row, pk="pid")


def delete_before(db: sqlite_utils.Database, cutoff: float, tables: Sequence[str]) -> None:
    """Delete the rows of ``tables`` placed before ``cutoff`` (each by its own time, as
    :func:`prune` ages them: an interval by ``ts_end``, an NCCL call by ``ts_enter``), in
    the caller's transaction."""
    aged = dict(_AGED)
    for table in tables:
        db.conn.execute(f"DELETE FROM {table} WHERE {aged[table]} < ?", (cutoff,))


# The node DB's schema version that has the ``engines`` table (ingero.nodedb.schema).
ENGINES_SCHEMA = 5


class NoEnginesTable(Exception):
    """The node DB predates the ``engines`` table (its schema ``version``)."""

    def __init__(self, version: int) -> None:
        super().__init__(version)
        self.version = version


def record_engines(db_path: Path, rows: Sequence[tuple[object, ...]], keep: int) -> None:
    """Refresh one ``engines`` row per server (pid, engine, model, role, service,
    metrics_url, job_id, rank, first_seen, last_seen) and keep the ``keep`` most recently
    seen. The node DB is opened to write, never created or migrated: the tracer owns its
    schema. Raises sqlite3.Error, or NoEnginesTable below ENGINES_SCHEMA."""
    conn = sqlite3.connect(f"file:{db_path}?mode=rw", uri=True, timeout=0.5)
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version < ENGINES_SCHEMA:
            raise NoEnginesTable(version)
        with conn:
            conn.executemany(
                "INSERT INTO engines (pid, engine, model, role, service, metrics_url,"
                " job_id, rank, first_seen, last_seen) VALUES (?,?,?,?,?,?,?,?,?,?)"
                " ON CONFLICT(pid) DO UPDATE SET engine=excluded.engine,"
                " model=excluded.model, role=excluded.role, service=excluded.service,"
                " metrics_url=excluded.metrics_url, job_id=excluded.job_id,"
                " rank=excluded.rank, last_seen=excluded.last_seen,"
                " first_seen=CASE WHEN engines.engine = excluded.engine"
                " THEN engines.first_seen ELSE excluded.first_seen END",
                rows,
            )
            conn.execute(
                "DELETE FROM engines WHERE pid NOT IN"
                " (SELECT pid FROM engines ORDER BY last_seen DESC LIMIT ?)",
                (keep,),
            )
    finally:
        conn.close()
