"""The dashboard's job page for jobs of 10, 100 and 1,000 ranks: time to answer its
questions and render it (medians of ``--repeat`` runs), and its size.

A real Echo store holds one job per size: every rank a node with an hour of score samples
(one a minute), one straggler with an episode, peer lag on a tenth of the ranks and a
drain. The page is what ``GET /dashboard/clusters/C/jobs/J`` answers: the
``job_timeline`` and ``job_report`` questions, then the HTML.

    .venv/bin/python -m bench.dashboard [--repeat 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

from ingero.echo.auth import Principal
from ingero.echo.dashboard import view
from ingero.echo.rates import GpuRates
from ingero.echo.rows import ScorePoint
from ingero.echo.service import Service
from ingero.echo.store import Store
from ingero.runtime.clock import ManualClock
from ingero.schema.events import Event

START = 1_700_000_000.0
MINUTES = 60
CLUSTER = "bench"


def job_id(ranks: int) -> str:
    return f"job{ranks}"


def node_of(ranks: int, rank: int) -> str:
    return f"n{ranks}-{rank:04d}"


def fill(store: Store, ranks: int, cluster: str = CLUSTER) -> str:
    """One job of ``ranks`` ranks (one a node); its straggler is the middle rank's node,
    whose id is returned."""
    job = job_id(ranks)
    slow = ranks // 2
    scores = [
        ScorePoint(
            cluster,
            node_of(ranks, r),
            START + 60.0 * m,
            (0.3 if r == slow and m >= 20 else 0.9) + 0.01 * (r % 5),
            job_id=job,
            gpu_model="H100",
            gpu_count=8,
        )
        for r in range(ranks)
        for m in range(MINUTES)
    ]
    node = node_of(ranks, slow)

    def event(kind: str, who: str, ts: float, rank: int, **extra: object) -> Event:
        return Event(
            kind,
            who,
            cluster,
            ts,
            job_id=job,
            rank=rank,
            score=0.3,
            threshold=0.8,
            detection_mode="fleet",
            dominant_signal="compute",
            extra=dict(extra),
        )

    episode = event("straggler_state", node, START + 1200.0, slow)
    events = [
        episode,
        dataclasses.replace(episode, timestamp=START + 1800.0),
        event("node_drained", node, START + 2400.0, slow, reason="ingero: score 0.3"),
    ]
    for r in range(0, ranks, 10):
        lag = event(
            "peer_lag",
            node_of(ranks, r),
            START + 600.0 + r,
            r,
            state="start",
            op="AllReduce",
            comm_hash="c0",
            lag_p50_ms=50.0 + 10 * (r % 7),
        )
        events.append(lag)
    store.write(events, scores)
    return node


def measure(repeat: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        clock = ManualClock(start=START + 3600.0)
        store = Store(Path(tmp) / "e.db", clock=clock)
        try:
            for ranks in (10, 100, 1000):
                fill(store, ranks)
            service = Service(store.path, GpuRates("USD", 1.0, {}), clock=clock)
            ops = Principal("ops")
            print(
                f"{'ranks':>6} {'job_timeline ms':>16} {'job_report ms':>14} {'HTML ms':>8}"
                f" {'total ms':>9} {'page KiB':>9} {'table rows':>10}"
            )
            for ranks in (10, 100, 1000):
                args = {"cluster_id": CLUSTER, "job_id": job_id(ranks)}
                steps: list[tuple[float, float, float]] = []
                text = ""
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    timeline = service.answer("job_timeline", args, ops)
                    t1 = time.perf_counter()
                    report = service.answer("job_report", args, ops)
                    t2 = time.perf_counter()
                    text = view.job_page(CLUSTER, timeline, report, running=True, signed_in=True)
                    steps.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
                q, r, h = (statistics.median(s[i] for s in steps) * 1000 for i in range(3))
                total = statistics.median(sum(s) for s in steps) * 1000
                print(
                    f"{ranks:>6} {q:>16.1f} {r:>14.1f} {h:>8.1f} {total:>9.1f}"
                    f" {len(text.encode()) / 1024:>9.1f} {text.count('<tr>'):>10}"
                )
        finally:
            store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    measure(parser.parse_args().repeat)


if __name__ == "__main__":
    main()
