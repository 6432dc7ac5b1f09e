"""writer: batched writes, size-bounded pruning (oldest first), retry after a failed write."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import sqlite_utils

from ingero.nodedb.schema import SCHEMA_VERSION, connect
from ingero.nodedb.writer import (
    Batch,
    NodeDbWriter,
    delete_before,
    prune,
    used_bytes,
    write_batch,
)


def _interval(ts: float, pid: int = 1) -> dict[str, object]:
    return {"ts_start": ts - 1, "ts_end": ts, "pid": pid, "source": "cuda_runtime",
            "op": "cudaMalloc", "count": 10, "total_ns": 1000, "p50_ns": 90, "p95_ns": 100,
            "p99_ns": 110, "errors": 0, "bytes": 0, "job_id": None, "rank": None}  # fmt: skip


def _raw(ts: float) -> dict[str, object]:
    return {"ts": ts, "pid": 1, "tid": 1, "source": "cuda_runtime", "op": "cudaMalloc",
            "duration_ns": 100, "ret": 0, "bytes": 0, "detail": "x" * 200,
            "job_id": None, "rank": None}  # fmt: skip


def _proc(pid: int, ts: float, job: str | None = None) -> dict[str, object]:
    return {"pid": pid, "comm": "a", "exe": "/a", "job_id": job, "rank": None,
            "first_seen": ts, "last_seen": ts}  # fmt: skip


def test_write_batch_and_process_upsert() -> None:
    db = connect(":memory:")
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    n = write_batch(db, Batch([_interval(10.0)], [_raw(9.5)], [], [_proc(1, 10.0, "7")]))
    assert n == 3
    write_batch(db, Batch(processes=[_proc(1, 20.0)]))
    row = db.execute("SELECT job_id, first_seen, last_seen FROM processes").fetchone()
    assert row == ("7", 10.0, 20.0)  # job kept, last_seen advanced


def test_prune_deletes_oldest_first_until_it_fits() -> None:
    db = connect(":memory:")
    for i in range(200):
        write_batch(db, Batch([_interval(1000.0 + i)], [_raw(1000.0 + i + 0.5)] * 20))
    before = used_bytes(db)
    limit = before // 3
    deleted = prune(db, limit)
    assert deleted > 0
    assert used_bytes(db) <= limit
    oldest_kept = db.execute("SELECT MIN(ts) FROM raw_events").fetchone()[0]
    newest = db.execute("SELECT MAX(ts) FROM raw_events").fetchone()[0]
    assert newest == 1199.5  # the newest data survives
    assert oldest_kept > 1000.5
    # Nothing newer than a kept row was deleted: kept rows are one contiguous recent range.
    kept = db.execute("SELECT COUNT(*) FROM raw_events").fetchone()[0]
    assert kept == 20 * (1199 - int(oldest_kept) + 1)


def _nccl(ts: float) -> tuple[dict[str, object], dict[str, object]]:
    base = {"pid": 1, "job_id": "7", "rank": 0, "comm_hash": "00000000000000ab",
            "comm_rank": 0, "nranks": 4}  # fmt: skip
    call = {**base, "ts_enter": ts, "ts_return": ts + 0.1, "tid": 1, "seq": int(ts),
            "op": "ncclAllReduce", "bytes": 4096, "ret": 0}  # fmt: skip
    comm = {**base, "ts": ts, "calls": 1, "entered_seq": int(ts), "returned_seq": int(ts),
            "last_enter_ts": ts, "inflight_seq": None, "inflight_op": None,
            "inflight_since": None, "wait_ns": 100, "sampled": 1, "dropped": 0}  # fmt: skip
    return call, comm


def test_prune_covers_the_nccl_tables() -> None:
    db = connect(":memory:")
    for i in range(300):
        call, comm = _nccl(1000.0 + i)
        write_batch(db, Batch(nccl_calls=[call] * 20, nccl_comms=[comm]))
    limit = used_bytes(db) // 3
    assert prune(db, limit) > 0
    assert used_bytes(db) <= limit
    for table, col in (("nccl_calls", "ts_enter"), ("nccl_comms", "ts")):
        lo, hi = db.execute(f"SELECT MIN({col}), MAX({col}) FROM {table}").fetchone()
        assert hi == 1299.0 and lo > 1000.0, table  # the oldest went, the newest stayed


def test_delete_before_cuts_each_table_by_its_own_time() -> None:
    # The lock-step job runner cuts its NCCL rows with its interval rows: a call is placed
    # by its arrival, a communicator row by its ts (neither table has a ts_end).
    db = connect(":memory:")
    for ts in (100.0, 200.0):
        call, comm = _nccl(ts)
        write_batch(db, Batch([_interval(ts)], nccl_calls=[call], nccl_comms=[comm]))
    with db.conn:
        delete_before(db, 150.0, ("intervals", "nccl_calls", "nccl_comms"))
    for table, col in (("intervals", "ts_end"), ("nccl_calls", "ts_enter"), ("nccl_comms", "ts")):
        assert db.execute(f"SELECT {col} FROM {table}").fetchall() == [(200.0,)], table


def test_prune_is_a_no_op_under_the_limit() -> None:
    db = connect(":memory:")
    write_batch(db, Batch([_interval(1.0)]))
    assert prune(db, 10**9) == 0


def test_writer_retries_after_a_locked_database(tmp_path: Path) -> None:
    path = tmp_path / "node.db"
    writer = NodeDbWriter(path)
    writer._db.conn.execute("PRAGMA busy_timeout = 0")
    blocker = sqlite3.connect(path, timeout=0)
    blocker.execute("BEGIN EXCLUSIVE")
    writer._write(Batch([_interval(1.0)]))  # fails: the DB is locked
    assert writer.stats.errors == 1 and "locked" in (writer.stats.last_error or "")
    blocker.rollback()
    blocker.close()
    writer._write(Batch([_interval(2.0)]))  # succeeds, and writes the kept batch first
    writer.close()
    rows = connect(path).execute("SELECT ts_end FROM intervals ORDER BY ts_end").fetchall()
    assert rows == [(1.0,), (2.0,)]


def test_writer_thread_writes_everything_before_close(tmp_path: Path) -> None:
    path = tmp_path / "node.db"
    writer = NodeDbWriter(path, max_bytes=10**8)
    writer.start()
    for i in range(50):
        assert writer.submit(Batch([_interval(float(i))]))
    writer.close()
    assert connect(path).execute("SELECT COUNT(*) FROM intervals").fetchone()[0] == 50
    assert writer.stats.batches == 50 and writer.stats.errors == 0


def test_a_version_1_node_db_is_migrated_keeping_its_rows(tmp_path: Path) -> None:
    from ingero.nodedb.schema import GPU_HEALTH_COLUMNS, MIGRATIONS

    path = tmp_path / "v1.db"
    old = sqlite_utils.Database(path)
    MIGRATIONS[0](old)
    old.execute("PRAGMA user_version = 1")
    row = {"ts_start": 1.0, "ts_end": 2.0, "gpu": 0, "busy_ns": 5, "mem_free_bytes": 1,
           "mem_total_bytes": 2}  # fmt: skip
    old.table("gpu_intervals").insert(row)
    old.conn.commit()
    old.conn.close()
    writer = NodeDbWriter(path)
    writer.close()
    db = connect(path, readonly=True)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 7
    columns = {c.name for c in db.table("gpu_intervals").columns}
    assert set(GPU_HEALTH_COLUMNS) <= columns
    # The old row is there; what version 1 never measured reads as NULL, not 0.
    assert db.execute(
        "SELECT busy_ns, throttle_reasons, ecc_uncorrected, xid_count FROM gpu_intervals"
    ).fetchall() == [(5, None, None, None)]
    assert db.table("gpu_processes").exists()
    # Version 3: the NCCL tables, with the indexes their readers rely on.
    assert db.table("nccl_calls").exists() and db.table("nccl_comms").exists()
    indexes = {tuple(i.columns) for t in ("nccl_calls", "nccl_comms") for i in db.table(t).indexes}
    assert {("ts_enter",), ("comm_hash", "seq"), ("ts",)} <= indexes
    assert db.table("stream_intervals").exists()


def _stream(ts: float, stream: str = "00007f00c0de0000") -> dict[str, object]:
    return {"ts_start": ts - 1.0, "ts_end": ts, "pid": 7, "stream": stream, "syncs": 10,
            "sync_ns": 5000, "launches": 30, "steps": 10, "step_ns": 10**7,
            "step_p50_ns": 10**6, "step_p90_ns": 10**6, "step_hist": '{"79": 10}'}  # fmt: skip


def _old_db(path: Path, version: int) -> sqlite_utils.Database:
    """A node DB as ``version`` made it, by the schema's own migrations."""
    from ingero.nodedb.schema import MIGRATIONS

    old = sqlite_utils.Database(path)
    for step in MIGRATIONS[:version]:
        step(old)
    old.execute(f"PRAGMA user_version = {version}")
    return old


def test_a_version_5_node_db_is_upgraded_in_place_keeping_every_row(tmp_path: Path) -> None:
    """Version 6 adds ``stream_intervals`` and nothing else: a version 5 DB's rows (its
    engines and marks included) are all there after the writer opens it, and stream rows
    are written and pruned by age like the others."""
    path = tmp_path / "v5.db"
    old = _old_db(path, 5)
    old.table("intervals").insert(_interval(1.0))
    old.table("engines").insert({"pid": 40, "engine": "vllm", "first_seen": 1.0,
                                 "last_seen": 2.0})  # fmt: skip
    old.table("marks").insert({"ts_start": 1.0, "pid": 3, "kind": "step", "name": "step"})
    old.conn.commit()
    before = {t: old.execute(f"SELECT * FROM {t}").fetchall() for t in old.table_names()}
    old.conn.close()
    writer = NodeDbWriter(path)
    writer._write(Batch([_interval(2.0)], stream_intervals=[_stream(2.0), _stream(3.0)]))
    writer.close()
    db = connect(path, readonly=True)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert set(db.table_names()) == set(before) | {"stream_intervals"}
    for table, rows in before.items():
        now = db.execute(f"SELECT * FROM {table}").fetchall()
        # each old row as it was (version 7 adds intervals.uid after its columns)
        assert [r[: len(old)] for r, old in zip(now, rows, strict=False)] == rows, table
    assert db.execute("SELECT ts_end, stream, syncs FROM stream_intervals").fetchall() == [
        (2.0, "00007f00c0de0000", 10),
        (3.0, "00007f00c0de0000", 10),
    ]
    db.conn.close()
    rw = connect(path)
    rw.execute("DELETE FROM intervals")
    rw.conn.commit()
    # Pruned by age with the rest: the oldest stream row goes first.
    prune(rw, 0)
    assert rw.execute("SELECT COUNT(*) FROM stream_intervals").fetchone()[0] == 0


def _stack(key: str, ts: float) -> dict[str, object]:
    return {"stack_key": key, "frames": '{"frames":[]}', "first_seen": ts, "last_seen": ts}


def test_stacks_are_stored_once_and_pruned_with_their_last_event() -> None:
    db = connect(":memory:")
    write_batch(
        db, Batch(raw_events=[{**_raw(10.0), "stack_key": "a"}], stacks=[_stack("a", 10.0)])
    )
    write_batch(
        db, Batch(raw_events=[{**_raw(20.0), "stack_key": "a"}], stacks=[_stack("a", 20.0)])
    )
    write_batch(db, Batch(stacks=[_stack("a", 15.0)]))  # a late batch never moves it back
    assert db.execute("SELECT stack_key, first_seen, last_seen FROM stacks").fetchall() == [
        ("a", 10.0, 20.0)
    ]
    for i in range(300):
        ts = 1000.0 + i
        write_batch(db, Batch(raw_events=[{**_raw(ts), "stack_key": f"k{i}"}] * 5,
                              stacks=[_stack(f"k{i}", ts)]))  # fmt: skip
    prune(db, used_bytes(db) // 3)
    keys = {r[0] for r in db.execute("SELECT stack_key FROM stacks")}
    used = {r[0] for r in db.execute("SELECT DISTINCT stack_key FROM raw_events")}
    assert "a" not in keys and "k299" in keys
    assert used <= keys  # every kept event still finds its stack


def test_a_collective_written_in_flight_is_completed_in_place() -> None:
    db = connect(":memory:")
    hung, _ = _nccl(1000.0)
    other = {**hung, "pid": 2}  # another rank of the same collective, on this node
    write_batch(db, Batch(nccl_calls=[{**hung, "ts_return": None, "ret": None},
                                      {**other, "ts_return": None, "ret": None}]))  # fmt: skip
    done = {k: hung[k] for k in ("pid", "comm_hash", "seq", "ts_enter")}
    assert write_batch(db, Batch(nccl_returns=[{**done, "ts_return": 1004.5, "ret": 0}])) == 1
    rows = db.execute("SELECT pid, seq, ts_enter, ts_return, ret FROM nccl_calls ORDER BY pid")
    assert rows.fetchall() == [(1, 1000, 1000.0, 1004.5, 0), (2, 1000, 1000.0, None, None)]


def test_a_version_6_node_db_gets_the_step_rows_uid_keeping_every_row(tmp_path: Path) -> None:
    """Version 7 adds ``intervals.uid`` (the annotate writer's, on its step rows) and
    nothing else: the tracer's rows read it as NULL."""
    path = tmp_path / "v6.db"
    old = _old_db(path, 6)
    old.table("intervals").insert(_interval(1.0))
    old.conn.commit()
    old.conn.close()
    writer = NodeDbWriter(path)
    step_row = {**_interval(2.0), "source": "annotate", "op": "step", "uid": 1000}
    writer._write(Batch([step_row]))
    writer.close()
    db = connect(path, readonly=True)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 7
    rows = db.execute("SELECT ts_end, op, uid FROM intervals ORDER BY ts_end").fetchall()
    assert rows == [(1.0, "cudaMalloc", None), (2.0, "step", 1000)]
    db.conn.close()


def test_a_row_the_db_cannot_store_is_dropped_and_every_other_row_written(
    tmp_path: Path,
) -> None:
    """Only sqlite3.Error was caught: a lone surrogate (UnicodeEncodeError), an integer past
    64 bits (OverflowError) or a value SQLite cannot bind killed the writer's thread, and no
    later batch of any writer was written."""
    writer = NodeDbWriter(tmp_path / "node.db")
    writer.start()

    def mark(name: object, step: object = None, **extra: object) -> dict[str, object]:
        return {"ts_start": 1.0, "ts_end": None, "pid": 3, "uid": 0, "job_id": None,
                "rank": None, "kind": "label", "name": name, "step": step, "labels": None,
                **extra}  # fmt: skip

    bad = Batch(
        intervals=[_interval(1.0)],
        marks=[mark("ok"), mark("\ud800"), mark("big", 2**70), mark(object()),
               mark("no pid", pid=None), mark("ok too")],
    )  # fmt: skip
    assert writer.submit(bad)
    assert writer.submit(Batch(marks=[mark("later")]))
    writer.close()
    assert not writer._thread.is_alive()
    db = connect(tmp_path / "node.db", readonly=True)
    names = [r[0] for r in db.execute("SELECT name FROM marks ORDER BY rowid")]
    assert names == ["ok", "ok too", "later"]
    assert db.execute("SELECT COUNT(*) FROM intervals").fetchone()[0] == 1
    assert writer.stats.bad_rows == 4 and writer.stats.batches == 2
    assert writer.stats.last_error is not None and "4 row(s) dropped" in writer.stats.last_error
    db.conn.close()


def test_a_busy_db_mid_row_by_row_keeps_the_rest_for_the_next_write(tmp_path: Path) -> None:
    path = tmp_path / "node.db"
    writer = NodeDbWriter(path)
    rows = [_interval(1.0), {**_interval(2.0), "pid": 2**70}, _interval(3.0)]
    holder = sqlite3.connect(path, timeout=0)
    writer._db.conn.execute("PRAGMA busy_timeout = 0")
    try:
        holder.execute("BEGIN IMMEDIATE")  # every write is busy now
        writer._write(Batch(rows))
        assert writer.stats.rows == 0 and len(writer._retry) == 1
    finally:
        holder.rollback()
        holder.close()
    writer._write(Batch([_interval(4.0)]))
    writer.close()
    db = connect(path, readonly=True)
    ends = [r[0] for r in db.execute("SELECT ts_end FROM intervals ORDER BY ts_end")]
    assert ends == [1.0, 3.0, 4.0] and writer.stats.bad_rows == 1
    db.conn.close()
