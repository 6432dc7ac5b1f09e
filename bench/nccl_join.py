"""Fleet's cost to join NCCL communicators: 64 ranks x 1,000 collectives per push interval.

Run: ``.venv/bin/python -m bench.nccl_join`` (``--comms 1,10 --ranks 64 --collectives
1000 --intervals 10``). Each rank enters ``--collectives`` all-reduces per interval (one
rank 200 ms late), its node samples them as fleet-push does (``sample_calls``: at most 64
per communicator and push), and per interval Fleet

- decodes the health pushes (``decode_health`` as its receivers call it; one rank per node),
- files them (``CollectiveJoin.ingest``, on the receiver threads),
- ticks (``CollectiveJoin.tick``: join, peer_lag, hang check; on the tick thread).

Printed: medians over the intervals after the window filled, per interval for all
communicators, and per rank report.
"""

from __future__ import annotations

import argparse
import statistics
import time

from ingero.fleet.collectives import CollectiveJoin
from ingero.fleet.config import NcclConfig
from ingero.otlp.collectives import ClockOffset, CollectiveCall, CommReport, sample_calls
from ingero.otlp.health import NodePush, decode_health, encode_health

LATE_RANK, LATE_S = 5, 0.2


def interval_pushes(comms: int, ranks: int, collectives: int, k: int) -> list[NodePush]:
    """Interval ``k``'s pushes: one per (communicator, rank), as its node would send it."""
    out = []
    period_ns = 1_000_000_000 // collectives
    start_ns = 1_700_000_000_000_000_000 + k * 1_000_000_000
    first = k * collectives + 1
    for c in range(comms):
        comm_hash = f"{c + 1:016x}"
        for rank in range(ranks):
            delay = int(LATE_S * 1e9) if rank == LATE_RANK else 0
            calls = [
                CollectiveCall(
                    first + i,
                    "ncclAllReduce",
                    start_ns + i * period_ns + delay,
                    start_ns + i * period_ns + delay + 100_000,
                    1 << 24,
                )
                for i in range(collectives)
            ]
            last = first + collectives - 1
            report = CommReport(
                comm_hash,
                rank,
                ranks,
                last,
                last,
                collectives,
                last_enter_ns=calls[-1].entered_ns,
                calls=tuple(sample_calls(calls)),
            )
            out.append(
                NodePush(
                    node_id=f"j{c}n{rank}",
                    cluster_id="c1",
                    score=0.9,
                    job_id=str(c),
                    rank=rank,
                    collectives=(report,),
                    clock=ClockOffset(0.0, 0.0005),
                )
            )
    return out


def measure(comms: int, ranks: int, collectives: int, intervals: int) -> str:
    join = CollectiveJoin(NcclConfig(), node_ttl=25.0)
    decode_s, ingest_s, tick_s = [], [], []
    events = 0
    for k in range(intervals):
        pushes = interval_pushes(comms, ranks, collectives, k)
        bodies = [encode_health(p, 1_700_000_000_000_000_000) for p in pushes]
        t0 = time.perf_counter()
        decoded = [decode_health(b, details=False, rates=True).pushes[0] for b in bodies]
        t1 = time.perf_counter()
        for push in decoded:
            join.ingest(push, float(k))
        t2 = time.perf_counter()
        result = join.tick(1_700_000_000.0 + k + 1, float(k) + 0.999)
        t3 = time.perf_counter()
        events += len(result.events)
        if k >= 2:  # the first intervals fill the window
            decode_s.append(t1 - t0)
            ingest_s.append(t2 - t1)
            tick_s.append(t3 - t2)
    reports = comms * ranks
    dec, ing, tick = (statistics.median(x) * 1e3 for x in (decode_s, ingest_s, tick_s))
    flagged = sorted(join.rank_lags("c1", "c1/job/0", f"{1:016x}"), key=lambda r: -r.late)[0]
    return (
        f"{comms:>4} comm(s) x {ranks} ranks x {collectives} collectives/interval: "
        f"decode {dec:8.2f} ms  ingest {ing:7.2f} ms  tick {tick:7.2f} ms per interval; "
        f"per rank report: decode {dec * 1e3 / reports:6.1f} us  ingest "
        f"{ing * 1e3 / reports:5.1f} us  tick {tick * 1e3 / reports:5.1f} us  "
        f"(rank {flagged.comm_rank} flagged: lag p50 {flagged.lag_p50_s * 1e3:.1f} ms, "
        f"{events} events)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--comms", default="1,10")
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--collectives", type=int, default=1000)
    parser.add_argument("--intervals", type=int, default=10)
    args = parser.parse_args()
    for comms in (int(c) for c in args.comms.split(",")):
        print(measure(comms, args.ranks, args.collectives, args.intervals), flush=True)


if __name__ == "__main__":
    main()
