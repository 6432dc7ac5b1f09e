"""The two Slurm backends side by side on a real Slurm 25.11 cluster (3 nodes on loopback).

Needs root, the build of tests/slurm25/build.sh and pyslurm in this venv (tests/run.sh).
Per backend, ``--runs`` times: a drain decision to its reason visible (``drain`` plus the
backend's own node read that shows it), and a running 3-node job's nodes (``nodes(job)``
on a warm backend); prints p50/p95/max. The pyslurm worker starts once, before the runs
(its start is printed apart). Usage: ``.venv/bin/python -m bench.slurm_backends [--runs 30]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ingero.slurm.factory import make_backend
from ingero.slurm.jobnodes import make_job_nodes
from ingero.slurm.pyslurm_backend import PyslurmBackend
from tests.integration.slurm import slurm25
from tests.integration.slurm.cluster import missing_reason, slurm_cluster

REASON = "ingero: straggler score=0.30 threshold=0.86 job=41 since=2026-11-18T11:06:40Z"


def show(label: str, samples: list[float]) -> None:
    ms = sorted(s * 1000 for s in samples)
    p95 = ms[min(len(ms) - 1, int(len(ms) * 0.95))]
    print(
        f"{label:<34} p50 {statistics.median(ms):7.2f} ms  p95 {p95:7.2f} ms  max {ms[-1]:7.2f} ms"
    )


def timed(
    runs: int, step: Callable[[], None], after: Callable[[], None] = lambda: None
) -> list[float]:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        step()
        samples.append(time.perf_counter() - start)
        after()
    return samples


def _ignore(_: object) -> None:
    pass


def one_backend(kind: str, job: str, runs: int) -> None:
    start = time.perf_counter()
    backend = make_backend(kind, timeout=10)
    lookup = make_job_nodes(kind, timeout=10)
    if isinstance(backend, PyslurmBackend):
        backend.start()
        print(
            f"pyslurm worker start (import, slurm.conf): {(time.perf_counter() - start) * 1e3:.1f} ms"
        )

    def drain_visible() -> None:
        backend.drain("n2", REASON)
        node = {n.name: n for n in backend.nodes()}["n2"]
        assert node.reason == REASON and node.drained

    show(
        f"{kind}: drain -> reason visible", timed(runs, drain_visible, lambda: backend.resume("n2"))
    )
    assert lookup.nodes(job) == ["n1", "n2", "n3"]
    show(f"{kind}: job -> nodes", timed(runs, lambda: _ignore(lookup.nodes(job))))
    for held in (backend, getattr(lookup, "backend", None)):
        if isinstance(held, PyslurmBackend):
            held.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    reason = slurm25.pyslurm_missing_reason() or missing_reason(slurm25.PREFIX)
    if reason:
        raise SystemExit(f"cannot run: {reason}")
    root = Path(tempfile.mkdtemp(prefix="ingero-bench-slurm25-"))
    try:
        with slurm_cluster(root, 3, prefix=slurm25.PREFIX) as cluster:
            for key in ("SLURM_CONF", "PATH", "LD_LIBRARY_PATH"):
                os.environ[key] = cluster.env[key]
            job = cluster.run(
                ["sbatch", "--parsable", "-N3", "-o", "/dev/null", "--wrap", "sleep 600"]
            ).stdout.strip()
            cluster.wait(lambda: not cluster.idle_nodes(), 30, "the job running")
            for kind in ("scontrol", "pyslurm"):
                one_backend(kind, job, args.runs)
            cluster.run(["scancel", job], check=False)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
