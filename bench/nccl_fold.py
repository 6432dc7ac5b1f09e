"""The tracer's NCCL fold and node DB writes per interval, at 10,000 collectives/s per rank.

Run: ``.venv/bin/python -m bench.nccl_fold`` (``--rate 10000 --ranks 8 --intervals 30
--hang 10:20``). Each of ``--ranks`` processes on the node enters and returns ``--rate``
all-reduces per 1 s interval (each call 20 µs, back to back, so one crosses every
interval's end); from interval ``--hang`` A to B every rank is inside one collective that
returns at B. Per interval the fold (``Collectives.enter``/``leave``, then ``close``) and
the write of its ``nccl_calls``/``nccl_comms`` rows (and completions, where the tree has
them) into a node DB file (``write_batch``, one transaction as the writer thread does)
are timed (thread CPU time, median over the intervals of each kind). Prints rows written
and updates per interval: the cost of writing a call in flight and completing it later is
paid only by calls in flight a whole interval, not by the one crossing each interval end.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from ingero.nodedb.schema import connect
from ingero.nodedb.writer import Batch, write_batch
from ingero.trace.aggregate import Tags
from ingero.trace.collectives import Collectives

CALL_S = 20e-6


def run(rate: int, ranks: int, intervals: int, hang: tuple[int, int], db_path: Path) -> None:
    fold = Collectives()
    db = connect(db_path)
    tags = {pid: Tags("1", pid) for pid in range(ranks)}
    for pid in range(ranks):
        fold.comm_init(pid, 0xA000, 0xAB, pid, ranks)
    seq = dict.fromkeys(range(ranks), 0)
    open_call: dict[int, tuple[int, float]] = {}  # pid -> the call crossing into this interval
    stats: dict[str, list[tuple[float, float, int, int]]] = {"steady": [], "hung": []}
    for i in range(intervals):
        t0, t1 = float(i), float(i + 1)
        hung = hang[0] <= i < hang[1]
        c0 = time.thread_time()
        for pid in range(ranks):
            if pid in open_call and not hung:  # the call in flight returns now
                s, _ = open_call.pop(pid)
                fold.leave(pid, pid, t0 + CALL_S, 0, 0xA000, 0xAB, pid, ranks, s,
                           "ncclAllReduce", 4096, 0)  # fmt: skip
            if hung:
                continue
            step = 1.0 / rate
            for k in range(rate):
                ts = t0 + k * step
                seq[pid] += 1
                fold.enter(pid, pid, ts, 0xA000, 0xAB, pid, ranks, seq[pid], "ncclAllReduce", 4096)
                if k == rate - 1 and i + 1 != hang[0]:
                    open_call[pid] = (seq[pid], ts)  # crosses the interval's end
                else:
                    fold.leave(pid, pid, ts + CALL_S, 0, 0xA000, 0xAB, pid, ranks, seq[pid],
                               "ncclAllReduce", 4096, 0)  # fmt: skip
            if i + 1 == hang[0]:
                seq[pid] += 1  # enters the collective it hangs in, just before the end
                fold.enter(pid, pid, t1 - step / 2, 0xA000, 0xAB, pid, ranks, seq[pid],
                           "ncclAllReduce", 4096)  # fmt: skip
                open_call[pid] = (seq[pid], t1)
        rows = fold.close(t1, tags)
        c1 = time.thread_time()
        returns = list(getattr(rows, "returns", []))
        extra = {"nccl_returns": returns} if hasattr(Batch(), "nccl_returns") else {}
        write_batch(db, Batch(nccl_calls=rows.calls, nccl_comms=rows.comms, **extra))
        c2 = time.thread_time()
        kind = "hung" if hung or i == hang[1] else "steady"
        if i >= 2:  # the first intervals warm up
            stats[kind].append((c1 - c0, c2 - c1, len(rows.calls), len(returns)))
    db.conn.close()
    written = (
        connect(db_path)
        .execute("SELECT COUNT(*), SUM(ts_return IS NULL) FROM nccl_calls")
        .fetchone()
    )
    print(f"{rate:,} collectives/s x {ranks} ranks, {intervals} intervals of 1 s, "
          f"all ranks hung in intervals {hang[0]}..{hang[1] - 1}")  # fmt: skip
    for kind, got in stats.items():
        if not got:
            continue
        fold_ms = statistics.median(g[0] for g in got) * 1e3
        write_ms = statistics.median(g[1] for g in got) * 1e3
        print(f"  {kind:6} intervals ({len(got)}): fold {fold_ms:.1f} ms, write {write_ms:.1f} ms "
              f"per interval; rows written {sorted({g[2] for g in got})}, "
              f"updates {sorted({g[3] for g in got})}")  # fmt: skip
    print(f"  node DB: {written[0]:,} nccl_calls rows, {written[1]} with ts_return NULL")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=int, default=10_000)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--intervals", type=int, default=30)
    p.add_argument("--hang", default="10:20", help="A:B, the intervals every rank hangs in")
    a = p.parse_args()
    lo, hi = (int(x) for x in a.hang.split(":"))
    with tempfile.TemporaryDirectory() as tmp:
        run(a.rate, a.ranks, a.intervals, (lo, hi), Path(tmp) / "node.db")


if __name__ == "__main__":
    main()
