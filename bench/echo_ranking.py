"""Latency of Echo's straggler ranking over a store holding 10 million events.

The rows are generated directly into SQLite (not sent through OTLP: that would take hours
at ingest speed): ``--episodes`` straggler episodes of ``--per-episode`` events each
(straggler_state ticks then one straggler_resolved), spread over 4 clusters x 1,000 nodes,
2,000 jobs and 30 days, with the episodes table the writer would have built alongside. Then
the ranking questions run through the same ``Service.answer`` the API and MCP use, each
``--repeat`` times; the median and worst latency are printed.
Usage: .venv/bin/python bench/echo_ranking.py [--episodes 500000] [--per-episode 20] [--db PATH]
"""

from __future__ import annotations

import argparse
import random
import shutil
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlite_utils

from ingero.echo.auth import Principal
from ingero.echo.rates import GpuRates
from ingero.echo.schema import MIGRATIONS
from ingero.echo.service import Service
from ingero.runtime.clock import ManualClock
from ingero.sqlite.sqlitemigrate import migrate

CLUSTERS = 4
NODES = 1000
JOBS = 2000
DAYS = 30
T0 = 1_790_000_000.0
TICK = 5.0


def generate(db: Path, episodes: int, per_episode: int, seed: int) -> int:
    conn = sqlite3.connect(db, isolation_level=None)
    migrate(sqlite_utils.Database(conn), MIGRATIONS)
    indexes = conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name IN"
        " ('events', 'episodes') AND sql IS NOT NULL"
    ).fetchall()
    for name, _ in indexes:  # build indexes once, after the bulk load (much faster)
        conn.execute(f"DROP INDEX {name}")
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("PRAGMA journal_mode = OFF")
    rng = random.Random(seed)
    span = DAYS * 86400.0

    def rows() -> Iterator[tuple[list[tuple[Any, ...]], tuple[Any, ...]]]:
        for e in range(episodes):
            cluster = f"c{e % CLUSTERS}"
            node = f"{cluster}-n{rng.randrange(NODES):04d}"
            job = str(rng.randrange(JOBS))
            start = T0 + rng.random() * span
            threshold = 0.8
            scores = [threshold - 0.3 * rng.random() for _ in range(per_episode - 1)]
            evs = [
                (
                    uuid.UUID(int=rng.getrandbits(128), version=4).hex,
                    "straggler_state",
                    cluster,
                    node,
                    job,
                    None,
                    sc,
                    threshold,
                    "fleet",
                    "compute",
                    start + i * TICK,
                    start + i * TICK,
                    None,
                )
                for i, sc in enumerate(scores)
            ]
            end = start + (per_episode - 1) * TICK
            evs.append(
                (
                    uuid.UUID(int=rng.getrandbits(128), version=4).hex,
                    "straggler_resolved",
                    cluster,
                    node,
                    job,
                    None,
                    0.9,
                    threshold,
                    "fleet",
                    None,
                    end,
                    end,
                    None,
                )
            )
            episode = (
                cluster,
                node,
                job,
                start,
                end - TICK,
                end,
                max(threshold - s for s in scores),
                min(scores),
                per_episode,
            )
            yield evs, episode

    t0 = time.perf_counter()
    batch_events: list[tuple[Any, ...]] = []
    batch_episodes: list[tuple[Any, ...]] = []

    def flush() -> None:
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO events (event_id, type, cluster_id, node_id, job_id, rank, score,"
            " threshold, detection_mode, dominant_signal, ts, received, extra)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            batch_events,
        )
        conn.executemany(
            "INSERT INTO episodes (cluster_id, node_id, job_id, start_ts, last_ts, end_ts,"
            " max_depth, min_score, n_events) VALUES (?,?,?,?,?,?,?,?,?)",
            batch_episodes,
        )
        conn.execute("COMMIT")
        batch_events.clear()
        batch_episodes.clear()

    for evs, episode in rows():
        batch_events.extend(evs)
        batch_episodes.append(episode)
        if len(batch_events) >= 500_000:
            flush()
    flush()
    conn.executemany(
        "INSERT OR IGNORE INTO nodes (cluster_id, node_id, gpu_model, gpu_count) VALUES (?,?,?,?)",
        [
            (f"c{c}", f"c{c}-n{n:04d}", "NVIDIA H100 80GB HBM3", 8)
            for c in range(CLUSTERS)
            for n in range(NODES)
        ],
    )
    loaded = time.perf_counter() - t0
    for _, sql in indexes:
        conn.execute(sql)
    conn.execute("ANALYZE")
    conn.execute("PRAGMA journal_mode = WAL")
    total = conn.execute("SELECT count(*) FROM events").fetchone()[0]
    conn.close()
    print(
        f"generated {total:,} events, {episodes:,} episodes: load {loaded:.0f}s,"
        f" with indexes {time.perf_counter() - t0:.0f}s"
    )
    return int(total)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=500_000)
    parser.add_argument("--per-episode", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--db", type=Path, help="reuse (or create, and keep) this database; else a temporary one"
    )
    args = parser.parse_args()
    if args.db is not None:
        run(args.db, args)
        return
    work = Path(tempfile.mkdtemp(prefix="echo-rank-"))
    try:
        run(work / "echo.db", args)
    finally:
        shutil.rmtree(work)  # ~2.8 GB at the defaults


def run(db: Path, args: argparse.Namespace) -> None:
    if not db.exists():
        generate(db, args.episodes, args.per_episode, seed=1)
    clock = ManualClock(start=T0 + DAYS * 86400.0)
    service = Service(db, GpuRates.load(), clock=clock)
    ops = Principal("ops")
    tenant = Principal("tenant", frozenset({"c1"}))
    week = {"since": T0 + (DAYS - 7) * 86400.0}
    month = {"since": T0}
    cases: list[tuple[str, str, dict[str, Any], Principal]] = [
        ("cluster, 7 days, by time", "stragglers", {"cluster_id": "c1", **week}, ops),
        ("cluster, 30 days, by time", "stragglers", {"cluster_id": "c1", **month}, ops),
        (
            "cluster, 30 days, by depth",
            "stragglers",
            {"cluster_id": "c1", "order_by": "depth", **month},
            ops,
        ),
        (
            "all clusters, 30 days, by episodes",
            "stragglers",
            {"order_by": "episodes", **month},
            ops,
        ),
        ("one job, 30 days", "stragglers", {"job_id": "42", **month}, ops),
        ("scoped token, 30 days", "stragglers", month, tenant),
        ("cost, cluster, 30 days", "cost", {"cluster_id": "c1", **month}, ops),
        # event history: node filters scan the time range of the (cluster_id, ts, node_id)
        # index; a node with no events in the window is the worst case (the whole range)
        ("events, one node, 7 days", "events", {"node_id": "c1-n0042", **week}, ops),
        (
            "events, one node of a cluster, 7 days",
            "events",
            {"cluster_id": "c1", "node_id": "c1-n0042", **week},
            ops,
        ),
        (
            "events, one node, scoped token, 7 days",
            "events",
            {"node_id": "c1-n0042", **week},
            tenant,
        ),
        ("events, unknown node, 7 days", "events", {"node_id": "c1-n9999", **week}, ops),
        ("events, one job, 30 days", "events", {"job_id": "42", **month}, ops),
        ("job report", "job_report", {"job_id": "42"}, ops),
    ]
    print(f"database: {db} ({db.stat().st_size / 1e9:.2f} GB)")
    for label, name, raw, who in cases:
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            answer = service.answer(name, raw, who)
            times.append(time.perf_counter() - t)
        rows = len(answer.get("stragglers", answer.get("nodes", answer.get("events", []))))
        print(
            f"{label:38s} median {statistics.median(times) * 1e3:7.1f} ms"
            f"  max {max(times) * 1e3:7.1f} ms  ({rows} rows)"
        )


if __name__ == "__main__":
    main()
