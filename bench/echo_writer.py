"""Echo's writer alone: wall µs per event of each SQL statement as the database grows.

Commits ``--batches`` batches of ``--batch`` events of ``--type`` (the stream of
``bench/echo_ingest.py``) through the real ``Store`` writer thread, in this process, and
times every statement of the second half (so the b-trees already hold half the events).
Usage: .venv/bin/python bench/echo_writer.py [--batches N] [--batch B]
"""

from __future__ import annotations

import argparse
import collections
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from ingero.echo.store import Store
from ingero.schema.events import Event


class _Rows(list[Any]):
    """Rows already fetched, read back like a cursor."""

    def fetchone(self) -> Any:
        return self[0] if self else None

    def fetchall(self) -> list[Any]:
        return list(self)


class _Timed:
    """The writer's connection, timing each statement by its first words."""

    def __init__(self, conn: sqlite3.Connection, totals: dict[str, float]) -> None:
        self._conn = conn
        self._totals = totals

    def _timed(self, method: str, sql: str, *args: Any) -> Any:
        t = time.perf_counter()
        result = getattr(self._conn, method)(sql, *args)
        if sql.startswith("SELECT"):
            result = _Rows(result.fetchall())  # fetched inside the timing
        self._totals[" ".join(sql.split()[:3])] += time.perf_counter() - t
        return result

    def execute(self, sql: str, *args: Any) -> Any:
        return self._timed("execute", sql, *args)

    def executemany(self, sql: str, *args: Any) -> Any:
        return self._timed("executemany", sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--batch", type=int, default=2_000)
    parser.add_argument("--type", default="straggler_state", help="event type to write")
    args = parser.parse_args()
    b = args.batch
    batches = [
        [
            Event(
                args.type,
                f"node{(r * b + i) % 2000}",
                f"c{i % 4}",
                1.7e9 + r + i / b,
                job_id=str(r % 50),
                score=0.5,
                threshold=0.8,
            )
            for i in range(b)
        ]
        for r in range(args.batches)
    ]
    half = args.batches // 2
    work = Path(tempfile.mkdtemp(prefix="echo-writer-"))
    store = Store(work / "e.db")
    totals: dict[str, float] = collections.defaultdict(float)
    try:
        for events in batches[:half]:
            store.write(events)
        conn = store._conn
        store._conn = _Timed(conn, totals)  # type: ignore[assignment]
        t0 = time.perf_counter()
        for events in batches[half:]:
            store.write(events)
        wall = time.perf_counter() - t0
        store._conn = conn
    finally:
        store.close()
        shutil.rmtree(work)
    n = (args.batches - half) * b
    print(
        f"writer: {wall / n * 1e6:.1f} µs wall per event ({half * b:,} to {args.batches * b:,} stored)"
    )
    for sql, seconds in sorted(totals.items(), key=lambda item: -item[1]):
        print(f"  {seconds / n * 1e6:6.1f} µs  {sql}")


if __name__ == "__main__":
    main()
