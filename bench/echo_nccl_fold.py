"""Echo's writer cost of folding NCCL ``peer_lag`` events into ``collective_episodes``.

Commits batches of ``peer_lag`` events as Fleet forwards them (``--ranks`` lagging ranks,
one episode each, re-emitted: every event after the first of an episode folds into its
row) through a real ``Store``, and the same events typed ``job_summary`` (stored as rows
only, no fold) in the same run, alternating; prints the writer's CPU µs per event of each
and their ratio. Usage:
.venv/bin/python bench/echo_nccl_fold.py [--ranks 256] [--batch 2000] [--batches 40]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from ingero.echo.rows import EventRow, event_row
from ingero.echo.store import Store
from ingero.schema.events import Event


def stream(kind: str, ranks: int, batch: int, batches: int) -> list[list[EventRow]]:
    ids = [str(uuid.uuid4()) for _ in range(ranks)]
    out = []
    for b in range(batches):
        rows = []
        for i in range(batch):
            extra = {
                "comm_hash": "9f3c2a1e0b8d4c7a",
                "comm_rank": i % ranks,
                "nranks": ranks,
                "op": "allreduce",
                "lag_p50_ms": 200.0 + b,
                "lag_p95_ms": 250.0 + b,
                "collectives": 20,
                "last_count": 14,
                "bytes": 1 << 26,
                "state": "start",
            }
            event = Event(
                kind,
                f"node{(i % ranks) // 8}",
                "c0",
                1.7e9 + b * 10 + i * 1e-3,
                event_id=ids[i % ranks],
                job_id="1",
                rank=i % ranks,
                extra=extra,
            )
            rows.append(event_row(event, 0.0))
        out.append(rows)
    return out


def cpu_per_event(batches: list[list[EventRow]], warm: int = 5) -> float:
    work = Path(tempfile.mkdtemp(prefix="echo-nccl-"))
    store = Store(work / "e.db")
    per: list[float] = []
    try:
        for i, rows in enumerate(batches):
            c0 = time.process_time()
            store.submit(rows=rows).result()
            if i >= warm:
                per.append((time.process_time() - c0) / len(rows))
    finally:
        store.close()
        shutil.rmtree(work)
    return statistics.median(per)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    folded = stream("peer_lag", args.ranks, args.batch, args.batches)
    plain = stream("job_summary", args.ranks, args.batch, args.batches)
    for _ in range(args.rounds):
        a, b = cpu_per_event(folded), cpu_per_event(plain)
        print(
            f"writer CPU per event: peer_lag (folded) {a * 1e6:.1f} µs,"
            f" same rows unfolded {b * 1e6:.1f} µs, ratio {a / b:.2f}"
        )


if __name__ == "__main__":
    main()
