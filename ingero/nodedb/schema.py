"""Node DB schema, versioned with SQLite ``user_version`` and migrated forward in order.

Tables (all timestamps are Unix seconds, durations nanoseconds):
- ``intervals``: per-interval aggregates per (pid, source, op): count, total, percentiles,
  errors, bytes; tagged with Slurm job id and rank.
- ``raw_events``: sampled individual calls (ring-buffer samples), for ``explain``/``query``.
- ``host_intervals``: per-interval host context (off-CPU time of traced threads, page
  allocations, block I/O latency, TCP retransmits, dropped samples).
- ``gpu_intervals``: per-interval per-GPU busy time and memory, where known; from version 2
  also what NVML reports of the GPU's clocks and hardware health (``GPU_HEALTH_COLUMNS``).
  NULL is "not measured" (not supported on this GPU, no permission, no NVML): never 0.
- ``gpu_processes`` (version 2): per interval, the processes NVML lists on each GPU, with the
  Slurm job and rank each belongs to.
- ``processes``: each traced process with its job tags.
- ``nccl_calls`` (version 3): sampled individual NCCL collectives with their sequence number
  on their communicator, entry (arrival) and return times.
- ``nccl_comms`` (version 3): per interval, per process, per NCCL communicator: collectives
  entered, the last entered/returned numbers and the oldest collective still in flight.
- ``stacks`` (version 4): one row per distinct call stack (``ingero.schema.stacks``), keyed
  by ``stack_key``; ``raw_events.stack_key`` and ``nccl_calls.stack_key`` refer to it (NULL:
  no stack captured). ``last_seen`` is the newest row referring to it, so pruning by age
  drops a stack with the last event that used it.
- ``marks`` (version 5): what the job itself says it does, through ``ingero annotate``'s
  socket: steps, phases (data loading, forward, checkpoint) and labels, each with the
  writer's pid and uid as the kernel reports them (SO_PEERCRED), never as the line claims.
- ``engines`` (version 5): inference servers recognised on the node (vLLM, SGLang, TGI,
  Triton, TensorRT-LLM): engine, model, role and the service name that groups replicas.
- ``stream_intervals`` (version 6): per interval, per (pid, CUDA stream): stream syncs,
  kernel launches naming the stream, and the steps between syncs (count, total, p50/p90 and
  the interval's log-linear histogram of step times as JSON).
- ``intervals.uid`` (version 7): the writer's uid (SO_PEERCRED) on the step rows ``ingero
  annotate`` writes; NULL on the tracer's rows.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Final

import sqlite_utils

from ingero.nodedb import SCHEMA_VERSION as SCHEMA_VERSION  # (defined where it is cheap)
from ingero.runtime.errors import EXIT_DATAERR, IngeroError, UnavailableError
from ingero.sqlite import sqlitemigrate
from ingero.sqlite.sqlitemigrate import SchemaError as SchemaError  # re-exported for readers


def _v1(db: sqlite_utils.Database) -> None:
    db.table("intervals").create(
        {
            "ts_start": float,
            "ts_end": float,
            "pid": int,
            "job_id": str,
            "rank": int,
            "source": str,  # cuda_runtime | cuda_driver | nccl | host | synthetic
            "op": str,
            "count": int,
            "total_ns": int,
            "p50_ns": int,
            "p95_ns": int,
            "p99_ns": int,
            "errors": int,
            "bytes": int,
        },
        not_null={"ts_start", "ts_end", "pid", "source", "op", "count", "total_ns"},
        defaults={"errors": 0, "bytes": 0},
    )
    db.table("intervals").create_index(["ts_end"])
    db.table("intervals").create_index(["op", "ts_end"])
    db.table("raw_events").create(
        {
            "ts": float,
            "pid": int,
            "tid": int,
            "job_id": str,
            "rank": int,
            "source": str,
            "op": str,
            "duration_ns": int,
            "ret": int,
            "bytes": int,
            "detail": str,  # JSON: op-specific fields (NCCL comm hash, nranks, datatype, …)
        },
        not_null={"ts", "pid", "source", "op"},
    )
    db.table("raw_events").create_index(["ts"])
    db.table("host_intervals").create(
        {
            "ts_start": float,
            "ts_end": float,
            "offcpu_ns": int,
            "page_allocs": int,
            "block_io_count": int,
            "block_io_p99_ns": int,
            "tcp_retransmits": int,
            "dropped_events": int,
        },
        not_null={"ts_start", "ts_end"},
    )
    db.table("host_intervals").create_index(["ts_end"])
    db.table("gpu_intervals").create(
        {
            "ts_start": float,
            "ts_end": float,
            "gpu": int,
            "busy_ns": int,
            "mem_free_bytes": int,
            "mem_total_bytes": int,
        },
        not_null={"ts_start", "ts_end", "gpu"},
    )
    db.table("gpu_intervals").create_index(["ts_end"])
    db.table("processes").create(
        {
            "pid": int,
            "comm": str,
            "exe": str,
            "job_id": str,
            "rank": int,
            "first_seen": float,
            "last_seen": float,
        },
        pk="pid",
    )


# Columns version 2 adds to gpu_intervals (all nullable: NULL is "not measured").
GPU_HEALTH_COLUMNS: dict[str, str] = {
    "source": "TEXT",  # nvml | nvidia-smi
    "mem_used_bytes": "INTEGER",
    "sm_clock_mhz": "INTEGER",
    "sm_clock_max_mhz": "INTEGER",
    "throttle_reasons": "INTEGER",  # NVML clock event reasons bitmask at the interval's end
    "temperature_c": "INTEGER",
    "power_w": "REAL",
    "ecc_corrected": "INTEGER",  # volatile ECC error counts: cumulative since the driver loaded
    "ecc_uncorrected": "INTEGER",
    "retired_pages": "INTEGER",  # cumulative
    "retired_pages_pending": "INTEGER",  # 0/1
    "remapped_rows_correctable": "INTEGER",  # cumulative
    "remapped_rows_uncorrectable": "INTEGER",
    "remap_pending": "INTEGER",  # 0/1
    "remap_failure": "INTEGER",  # 0/1
    "xid_count": "INTEGER",  # critical XID events in the interval (NULL: not watched)
    "xids": "TEXT",  # JSON list of those XID numbers
    "lost": "INTEGER",  # 1: NVML answered GPU_IS_LOST
}


def _v2(db: sqlite_utils.Database) -> None:
    for name, kind in GPU_HEALTH_COLUMNS.items():
        # Plain DDL: this runs inside the migration's own transaction.
        db.execute(f"ALTER TABLE gpu_intervals ADD COLUMN {name} {kind}")
    db.table("gpu_processes").create(
        {
            "ts_end": float,
            "gpu": int,
            "pid": int,
            "used_memory_bytes": int,
            "job_id": str,
            "rank": int,
        },
        not_null={"ts_end", "gpu", "pid"},
    )
    db.table("gpu_processes").create_index(["ts_end"])


def _v3(db: sqlite_utils.Database) -> None:
    # comm_hash: 16 lowercase hex digits, as raw_events.detail carries it (identical on
    # every rank of a communicator: the join key across nodes). rank: the Slurm rank tag,
    # as raw_events.rank; comm_rank: the rank inside the communicator.
    db.table("nccl_calls").create(
        {
            "ts_enter": float,  # arrival (uprobe entry), Unix s
            "ts_return": float,  # return, or the outermost ncclGroupEnd's; NULL: in flight
            "pid": int,
            "tid": int,
            "job_id": str,
            "rank": int,
            "comm_hash": str,
            "comm_rank": int,
            "nranks": int,
            "seq": int,  # n-th collective on the communicator in this process, from 1
            "op": str,
            "bytes": int,
            "ret": int,
        },
        not_null={"ts_enter", "pid", "comm_hash", "seq", "op"},
    )
    db.table("nccl_calls").create_index(["ts_enter"])
    db.table("nccl_calls").create_index(["comm_hash", "seq"])
    db.table("nccl_comms").create(
        {
            "ts": float,  # interval end, Unix s
            "pid": int,
            "job_id": str,
            "rank": int,
            "comm_hash": str,
            "comm_rank": int,
            "nranks": int,
            "calls": int,  # collectives entered in the interval
            "entered_seq": int,  # last entered (0: none yet)
            "returned_seq": int,  # last returned (0: none yet)
            "last_enter_ts": float,
            "inflight_seq": int,  # oldest collective entered and not returned (NULL: none)
            "inflight_op": str,
            "inflight_since": float,  # its arrival, Unix s
            "wait_ns": int,  # host-side durations of the collectives returned in the interval
            "sampled": int,  # calls of the interval written to nccl_calls
            "dropped": int,  # calls of the interval not written there
        },
        not_null={"ts", "pid", "comm_hash", "calls", "entered_seq", "returned_seq"},
    )
    db.table("nccl_comms").create_index(["ts"])


def _v4(db: sqlite_utils.Database) -> None:
    db.table("stacks").create(
        {
            "stack_key": str,  # ingero.schema.stacks.stack_key of the frames
            "frames": str,  # JSON: Stack.to_json() (frames innermost first, reason)
            "first_seen": float,  # Unix s
            "last_seen": float,
        },
        pk="stack_key",
        not_null={"frames", "first_seen", "last_seen"},
    )
    db.table("stacks").create_index(["last_seen"])
    db.table("raw_events").add_column("stack_key", str)
    db.table("nccl_calls").add_column("stack_key", str)


# ``intervals.source`` of the step rows ``ingero annotate`` writes from the job's step marks:
# steps, never a tracer interval (they neither cover time nor say the tracer is alive).
ANNOTATE_SOURCE: Final = "annotate"


def _v5(db: sqlite_utils.Database) -> None:
    db.table("marks").create(
        {
            "ts_start": float,  # Unix s
            "ts_end": float,  # NULL: an instant mark, or a phase still open
            "pid": int,  # the writer, from SO_PEERCRED
            "uid": int,
            "job_id": str,  # the writer's Slurm tags, as for its CUDA rows
            "rank": int,
            "kind": str,  # step | phase | label
            "name": str,  # phase name ("forward", "checkpoint"); "step" for steps
            "step": int,  # the job's own step number, where it gave one
            "labels": str,  # JSON object of the line's labels (bounded by annotate's limits)
        },
        not_null={"ts_start", "pid", "kind", "name"},
    )
    db.table("marks").create_index(["ts_start"])
    db.table("marks").create_index(["pid", "ts_start"])
    db.table("engines").create(
        {
            "pid": int,
            "engine": str,  # vllm | sglang | tgi | triton | trtllm
            "model": str,  # as the command line or /metrics names it; NULL: not said
            "role": str,  # prefill | decode | mixed | router; NULL: not said
            "service": str,  # the configured or derived name that groups replicas
            "metrics_url": str,  # where the engine serves /metrics; NULL: none found
            "job_id": str,
            "rank": int,
            "first_seen": float,
            "last_seen": float,
        },
        pk="pid",
        not_null={"engine", "first_seen", "last_seen"},
    )


def _v6(db: sqlite_utils.Database) -> None:
    db.table("stream_intervals").create(
        {
            "ts_start": float,
            "ts_end": float,
            "pid": int,
            "job_id": str,
            "rank": int,
            "stream": str,  # the stream handle, 16 lowercase hex digits (0: default stream)
            # stream syncs (cu[da]StreamSynchronize) and event syncs of an event last
            # recorded on the stream (cu[da]EventSynchronize)
            "syncs": int,
            "sync_ns": int,  # host time waiting in them
            "launches": int,  # kernel launches naming the stream (in an argument or config)
            "steps": int,  # sync-to-sync gaps ending in the interval
            "step_ns": int,
            "step_p50_ns": int,
            "step_p90_ns": int,
            # JSON {slot: count} of step times (ingero.trace.aggregate's log-linear slots)
            "step_hist": str,
        },
        not_null={"ts_start", "ts_end", "pid", "stream", "syncs", "launches", "steps"},
    )
    db.table("stream_intervals").create_index(["ts_end"])


def _v7(db: sqlite_utils.Database) -> None:
    # Plain DDL: this runs inside the migration's own transaction.
    db.execute("ALTER TABLE intervals ADD COLUMN uid INTEGER")


# Index i holds the migration from version i to i + 1. Append only.
MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [_v1, _v2, _v3, _v4, _v5, _v6, _v7]
assert len(MIGRATIONS) == SCHEMA_VERSION


def connect(
    path: str | Path, *, readonly: bool = False, timeout: float = 5.0
) -> sqlite_utils.Database:
    """Open the node DB. Writers get WAL mode and pending migrations; readers never write."""
    if readonly:
        uri = f"file:{Path(path)}?mode=ro"
        conn = sqlite3.connect(uri, uri=True, timeout=timeout, check_same_thread=False)
        db = sqlite_utils.Database(conn)
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise SchemaError(f"{path}: schema version {version} is newer than {SCHEMA_VERSION}")
        return db
    conn = sqlite3.connect(str(path), timeout=timeout, check_same_thread=False)
    db = sqlite_utils.Database(conn)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    migrate(db)
    return db


def version(db: sqlite_utils.Database) -> int:
    """The schema version of an open node DB (0: not a node DB at all)."""
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def migrate(db: sqlite_utils.Database) -> int:
    """Apply the node DB's pending migrations; returns the resulting version."""
    return sqlitemigrate.migrate(db, MIGRATIONS)


class NodeDbError(IngeroError):
    """The file is not a node DB this ingero can read."""

    exit_code = EXIT_DATAERR


def open_node_db(path: Path, timeout: float = 5.0) -> sqlite_utils.Database:
    """A read-only connection to a node DB, or a one-line error naming the path and the fix."""
    if not path.exists():
        raise UnavailableError(
            f"{path}: no node DB here; record one with `ingero trace --record`"
            " or point --db at an existing one"
        )
    if path.is_dir():
        raise NodeDbError(f"{path}: is a directory, not a node DB")
    try:
        db = connect(path, readonly=True, timeout=timeout)
    except SchemaError as exc:
        raise NodeDbError(f"{exc}: written by a newer ingero; upgrade ingero here") from None
    except sqlite3.Error as exc:
        raise NodeDbError(f"{path}: not a readable SQLite node DB ({exc})") from None
    found = version(db)
    if found < 1:
        # Older versions are read as they are (a v1 DB lacks only the GPU health columns).
        db.conn.close()
        raise NodeDbError(
            f"{path}: not a node DB (schema version {found}, expected 1 to {SCHEMA_VERSION})"
        )
    return db
