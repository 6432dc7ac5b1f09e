"""Cost of the NCCL collective report in one health push: 8 ranks x 1,000 calls per push.

Run: ``.venv/bin/python -m bench.nccl_push`` (``--repeat 20`` to shorten).

A node DB with the tracer's NCCL tables, holding ``--history`` push intervals of older rows
(the reader must not pay for them); before each timed push one more interval is written
(``--ranks`` ranks of one communicator, ``--calls`` sampled calls each). Timed per push:
``read`` (the reader: two indexed SQLite queries since the previous push, rows into
CommReports), ``encode`` (the health push with the reports: per-rank sampling to the wire
bounds, protobuf build) and ``serialize``; the pushed bytes (before any gzip) beside the
score-only push. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from ingero.otlp.health import NodePush, encode_health
from ingero.push.collectives import CollectivesReader
from tests.nccl_db import nccl_node_db, rank_interval

COMM = "0123456789abcdef"
INTERVAL = 5.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--history", type=int, default=120, help="older intervals in the DB")
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "node.db"
        conn = nccl_node_db(path)
        now = 1_700_000_000.0
        seq = 1

        def interval() -> None:
            nonlocal now, seq
            now += INTERVAL
            for rank in range(args.ranks):
                rank_interval(
                    conn, end=now, pid=1000 + rank, comm_hash=COMM, comm_rank=rank,
                    nranks=args.ranks, first_seq=seq, count=args.calls,
                    period=INTERVAL / args.calls,
                )  # fmt: skip
            seq += args.calls

        for _ in range(args.history):
            interval()
        reader = CollectivesReader(
            path, interval_s=INTERVAL, recent_intervals=3, max_calls_read=16384,
            pid_alive=lambda _: True,
        )  # fmt: skip
        reader.read(now)  # the first push: state only
        read_us, encode_us, serialize_us, sizes, base_sizes, sent = [], [], [], [], [], []
        for _ in range(args.repeat):
            interval()
            t0 = time.perf_counter()
            reports = reader.read(now)
            t1 = time.perf_counter()
            push = NodePush(node_id="n", cluster_id="c", score=0.9, job_id="1", collectives=reports)
            request = encode_health(push, int(now * 1e9))
            t2 = time.perf_counter()
            body = request.SerializeToString()
            t3 = time.perf_counter()
            read_us.append((t1 - t0) * 1e6)
            encode_us.append((t2 - t1) * 1e6)
            serialize_us.append((t3 - t2) * 1e6)
            sizes.append(len(body))
            base = NodePush(node_id="n", cluster_id="c", score=0.9, job_id="1")
            base_sizes.append(len(encode_health(base, int(now * 1e9)).SerializeToString()))
            sent.append(sum(len(r.calls) for r in reports))
        conn.close()

    def row(name: str, values: list[float]) -> str:
        values = sorted(values)
        p95 = values[int(0.95 * (len(values) - 1))]
        return f"| {name} | {statistics.median(values) / 1e3:.1f} ms | {p95 / 1e3:.1f} ms |"

    total = [a + b + c for a, b, c in zip(read_us, encode_us, serialize_us, strict=True)]
    print(f"{args.ranks} ranks x {args.calls} calls per push, {args.history} older intervals,")
    print(f"{args.repeat} pushes; {statistics.median(sent):.0f} calls sent per push\n")
    print("| step | median | p95 |\n|---|---:|---:|")
    for name, values in (
        ("read (SQLite -> CommReports)", read_us),
        ("encode (sampling + protobuf)", encode_us),
        ("serialize", serialize_us),
        ("total per push", total),
    ):
        print(row(name, values))
    print(
        f"\npush size: {statistics.median(sizes) / 1024:.1f} KiB"
        f" (score only: {statistics.median(base_sizes)} B)"
    )


if __name__ == "__main__":
    main()
