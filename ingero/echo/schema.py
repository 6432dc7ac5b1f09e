"""Echo's SQLite schema, versioned with ``user_version`` and migrated forward in order.

Tables (timestamps are Unix seconds):
- ``events``: every event once (``ts``, ``event_id``, ``type`` UNIQUE: an episode's events
  share one ``event_id``), the schema fields plus ``extra`` JSON.
- ``episodes``: pre-aggregated straggler episodes (first ``straggler_state`` of a node in a
  job until its ``straggler_resolved``), so ranking never scans raw events; ``event_id`` is
  the id of the event that opened it, so late events of a closed episode find it.
- ``scores``: downsampled health-score history, one row per node per bucket (indexed by
  job too, version 4).
- ``nodes``: last known facts per node (GPU model and count for the cost of straggling);
  ``last_seen`` from events is kept to within 5 minutes (the writer skips rewrites).
- ``collective_episodes``: NCCL ``peer_lag`` and ``collective_hang`` episodes, one row per
  (``event_id``, ``type``, ``cluster_id``) (Fleet gives an episode's events one id),
  folded as they arrive (``ingero.echo.collectives``), so the per-job ``collective_lag``
  question reads a job's episodes by index instead of its raw events.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlite_utils

from ingero.echo import collectives
from ingero.echo.rows import COLUMNS

# The events index that node filters read (questions name it: see answers.events).
EVENTS_BY_CLUSTER = "idx_events_cluster_id_ts_node_id"

# Tables a tenant may read through SQL, each with its cluster column.
TENANT_TABLES: tuple[str, ...] = ("events", "episodes", "scores", "nodes", "collective_episodes")


def _v1(db: sqlite_utils.Database) -> None:
    db.table("events").create(
        {
            "id": int,
            "event_id": str,
            "type": str,
            "cluster_id": str,
            "node_id": str,
            "job_id": str,
            "rank": int,
            "score": float,
            "threshold": float,
            "detection_mode": str,
            "dominant_signal": str,
            "ts": float,
            "received": float,
            "extra": str,  # JSON object: type-specific fields
        },
        pk="id",
        not_null={"event_id", "type", "cluster_id", "node_id", "ts", "received"},
    )
    db.table("events").create_index(["event_id", "type", "ts"], unique=True)
    db.table("events").create_index(["cluster_id", "ts"])
    db.table("events").create_index(["node_id", "ts"])
    db.table("events").create_index(["job_id"])
    db.table("events").create_index(["type", "ts"])
    db.table("episodes").create(
        {
            "id": int,
            "cluster_id": str,
            "node_id": str,
            "job_id": str,
            "start_ts": float,
            "last_ts": float,
            "end_ts": float,
            "max_depth": float,
            "min_score": float,
            "n_events": int,
        },
        pk="id",
        not_null={"cluster_id", "node_id", "job_id", "start_ts", "last_ts", "n_events"},
    )
    # Covering index in GROUP BY order: ranking reads it alone, one range per cluster.
    db.table("episodes").create_index(
        ["cluster_id", "node_id", "start_ts", "last_ts", "end_ts", "max_depth"],
        index_name="episodes_rank",
    )
    db.table("episodes").create_index(["job_id"])
    db.table("episodes").create_index(["end_ts"])  # the open ones (NULL) at start-up
    db.table("scores").create(
        {
            "cluster_id": str,
            "node_id": str,
            "bucket": float,
            "job_id": str,
            "n": int,
            "sum": float,
            "min": float,
            "max": float,
        },
        pk=("cluster_id", "node_id", "bucket"),
        not_null={"n", "sum", "min", "max"},
    )
    db.table("scores").create_index(["cluster_id", "bucket"])
    db.table("nodes").create(
        {
            "cluster_id": str,
            "node_id": str,
            "host_name": str,
            "gpu_model": str,
            "gpu_count": int,
            "provider": str,
            "last_score": float,
            "last_score_ts": float,
            "last_seen": float,
        },
        pk=("cluster_id", "node_id"),
    )


def _v2(db: sqlite_utils.Database) -> None:
    # Inserts append instead of scattering: a b-tree keyed by a random UUID or by node
    # takes a batch's events all over it, so each commit wrote a page per event (or per
    # node) there. Led by the timestamp (or by cluster, then timestamp) a batch of current
    # events lands at the right edge. Node filters scan the cluster's time range in the
    # index, which carries node_id. Writer at 0.5-1M events stored: 24.5 -> 8 µs per event
    # (docs/decisions/0010-echo-time-led-keys-and-decode-workers.md).
    for name in ("event_id_type_ts", "node_id_ts", "cluster_id_ts"):
        db.execute(f"DROP INDEX idx_events_{name}")
    db.table("events").create_index(["ts", "event_id", "type"], unique=True)
    db.table("events").create_index(["cluster_id", "ts", "node_id"])
    db.execute("ALTER TABLE episodes ADD COLUMN event_id TEXT")


def _v3(db: sqlite_utils.Database) -> None:
    # Plain SQL: the UNIQUE key is what the writer's upsert folds an episode's events on.
    db.execute(
        "CREATE TABLE collective_episodes ("
        " id INTEGER PRIMARY KEY,"
        " event_id TEXT NOT NULL, type TEXT NOT NULL,"
        " cluster_id TEXT NOT NULL, node_id TEXT NOT NULL, job_id TEXT NOT NULL, rank INTEGER,"
        " comm_hash TEXT, comm_rank INTEGER, nranks INTEGER, op TEXT, seq INTEGER,"
        " start_ts REAL NOT NULL, last_ts REAL NOT NULL, end_ts REAL,"
        " figures_ts REAL NOT NULL, figures_end INTEGER NOT NULL,"
        " n_events INTEGER NOT NULL,"
        " lag_p50_ms REAL, lag_p95_ms REAL, max_lag_p50_ms REAL, max_lag_p95_ms REAL,"
        " collectives INTEGER, last_count INTEGER, bytes INTEGER,"
        " missing_ranks TEXT, missing_nodes TEXT, inside_ranks INTEGER, inside_for_s REAL,"
        " since_ts REAL, reason TEXT, end_reason TEXT, missing_count INTEGER,"
        " late_count INTEGER, peers_wait_p50_ms REAL,"
        " UNIQUE (event_id, type, cluster_id))"
    )
    # A job's episodes (the question), and a node's (stragglers' annotations).
    db.execute(
        "CREATE INDEX collective_episodes_job ON collective_episodes (job_id, cluster_id, start_ts)"
    )
    db.execute(
        "CREATE INDEX collective_episodes_node"
        " ON collective_episodes (cluster_id, node_id, start_ts)"
    )
    # Events a version 2 store already holds fold in as new ones would (in any order).
    stored = db.execute(
        f"SELECT {', '.join(COLUMNS)} FROM events WHERE type IN (?, ?) ORDER BY id",
        sorted(collectives.TYPES),
    )
    db.conn.executemany(collectives.UPSERT, (collectives.episode_row(row) for row in stored))


def _v4(db: sqlite_utils.Database) -> None:
    # A job's score history (the dashboard's job page, question job_timeline) by index: the
    # cluster's time index walks every job's samples in the window. Covering: a 1,000-rank
    # job's hour is 60,000 samples, each a table lookup otherwise
    # (docs/decisions/0033-dashboard-scores-job-index.md). Samples are downsampled: the
    # writes stay few.
    db.execute(
        "CREATE INDEX scores_job ON scores (job_id, cluster_id, bucket, node_id, n, sum, min)"
    )


MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [_v1, _v2, _v3, _v4]
