"""The job's sacct verdict: its size, the fold of a 1,000-node job's events, and the time to
write it into the job's AdminComment through each backend on real clusters with slurmdbd.

1. Size: ingero's part of the AdminComment (the human line and ``INGERO1:`` base64 of gzip
   JSON; base32 for Slurm 22.05's lowercasing sacctmgr) for a 1,000-node job with 0 to
   1,000 straggling nodes (each also drained and holding an idle GPU), uncut and at the
   default bound (1,024 bytes).
2. Fold: a 1,000-node job's events (per node one episode: its straggler_state, 10 re-emits
   and its straggler_resolved; a peer_lag and a gpu_idle episode per 10 nodes) folded,
   the verdict built and encoded; p50 over ``--runs``.
3. Write: ``write_verdict`` (accounting record read, merge, AdminComment set) of that
   verdict on ended jobs, per backend: scontrol (sacct + sacctmgr) on Debian's 22.05 and
   on 25.11, pyslurm (slurmdb API) on 25.11; p50/p95/max over ``--runs`` jobs.

Needs root, MariaDB, slurmdbd (tests/apt-packages.txt) and the 25.11 build with slurmdbd
(tests/slurm25/build.sh). Usage: ``.venv/bin/python -m bench.slurm_verdicts [--runs 20]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

from bench.slurm_backends import show
from ingero.schema.events import Event
from ingero.slurm.factory import make_backend
from ingero.slurm.pyslurm_backend import PyslurmBackend
from ingero.slurm.verdict import JobTally, decode_part, encode_part
from ingero.slurm.verdict_writer import WRITTEN, write_verdict
from tests.integration.slurm import slurm25
from tests.integration.slurm.cluster import (
    mariadb_missing_reason,
    mariadb_server,
    missing_reason,
    slurm_cluster,
)

NODES = 1000
T0 = 1_795_000_000.0


def job_events(stragglers: int, job: str = "7", cluster: str = "c") -> list[Event]:
    """A 1,000-node job of one hour: ``stragglers`` nodes each in one 10-minute episode
    (state, 10 re-emits, resolved), drained; a peer lag and an idle GPU per 10 of them."""
    events = []
    for i in range(stragglers):
        node, eid = f"gpu{i:04d}", str(uuid.uuid4())
        common = {"node_id": node, "cluster_id": cluster, "job_id": job, "rank": i}
        for k in range(11):
            events.append(
                Event(type="straggler_state", timestamp=T0 + 60 + 30 * k, event_id=eid,
                      score=0.5 - k * 0.01, threshold=0.86, dominant_signal="throughput",
                      extra={"cause_class": "hardware" if i % 3 == 0 else "node"}, **common)
            )  # fmt: skip
        events.append(
            Event(type="straggler_resolved", timestamp=T0 + 660, event_id=eid,
                  extra={"reason": "recovered", "since": T0 + 60}, **common)
        )  # fmt: skip
        events.append(Event(type="node_drained", timestamp=T0 + 300, extra={}, **common))
        if i % 10 == 0:
            events.append(
                Event(type="peer_lag", timestamp=T0 + 100, extra={"comm_hash": "ab" * 8,
                      "comm_rank": i, "lag_p50_ms": 100.0 + i, "state": "start"}, **common)
            )  # fmt: skip
            events.append(
                Event(type="gpu_idle", timestamp=T0 + 3000, extra={"state": "start",
                      "gpus": [0, 1], "since": T0 + 3000, "reason": "no_process"}, **common)
            )  # fmt: skip
    return events


def verdict_of(events: list[Event], job: str = "7", cluster: str = "c") -> JobTally:
    tally = JobTally(cluster, job)
    for event in events:
        tally.add(event)
    return tally


def sizes() -> None:
    print(f"-- ingero's part of the AdminComment, a {NODES}-node job of 1 h (bytes)")
    # JSON: the verdict before any cut; then the part at the largest bound (16384: only the
    # lists past 16 entries cut) and at the default (1024), base64 and base32; cut: the
    # entries the default bound left out.
    print(f"{'straggling nodes':>17} {'JSON':>7} {'16384 b64':>10} {'16384 b32':>10} "
          f"{'1024 b64':>9} {'1024 b32':>9} {'cut':>5}")  # fmt: skip
    for n in (0, 1, 10, 100, 1000):
        verdict = verdict_of(job_events(n)).verdict(T0, T0 + 3600, NODES)
        raw = len(json.dumps(verdict, separators=(",", ":")))
        wide64, wide32 = encode_part(verdict, 16384), encode_part(verdict, 16384, base32=True)
        cut64, cut32 = encode_part(verdict), encode_part(verdict, base32=True)
        cut = decode_part(cut64).get("cut", 0)
        print(f"{n:>17} {raw:>7} {len(wide64):>10} {len(wide32):>10} {len(cut64):>9} "
              f"{len(cut32):>9} {cut:>5}")  # fmt: skip
    print(f"its human line: {cut64.rpartition(' ')[0]}")


def fold(runs: int) -> None:
    events = job_events(NODES)
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        encode_part(verdict_of(events).verdict(T0, T0 + 3600, NODES))
        samples.append(time.perf_counter() - start)
    show(f"fold+encode {len(events)} events", samples)


def writes(release: str, kinds: tuple[str, ...], runs: int, db: object) -> None:
    prefix = slurm25.PREFIX if release == "25.11" else None
    root = Path(tempfile.mkdtemp(prefix=f"ingero-bench-verdict{release}-"))
    root.chmod(0o755)
    try:
        name = "bench" + release.replace(".", "")
        with slurm_cluster(root, 2, cluster_name=name, prefix=prefix, accounting=db) as c:  # type: ignore[arg-type]
            for key in ("SLURM_CONF", "PATH", "LD_LIBRARY_PATH"):
                if key in c.env:
                    os.environ[key] = c.env[key]
                else:
                    os.environ.pop(key, None)
            jobs = [
                c.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "true"]).stdout.strip()
                for _ in range(runs * len(kinds))
            ]
            scontrol = make_backend("scontrol")

            def ended() -> bool:
                return all((r := scontrol.job_record(j)) is not None and r.ended for j in jobs)

            c.wait(ended, 300, "every job ended in accounting")
            events = job_events(NODES, cluster=name)
            for k, kind in enumerate(kinds):
                backend = make_backend(kind, timeout=30)
                samples = []
                for job in jobs[k * runs : (k + 1) * runs]:
                    tally = verdict_of(events, job, name)
                    start = time.perf_counter()
                    record = backend.job_record(job)
                    assert record is not None
                    outcome, _ = write_verdict(backend, tally, record, 1024)
                    samples.append(time.perf_counter() - start)
                    assert outcome == WRITTEN, outcome
                show(f"{release} {kind}: write one verdict", samples)
                if isinstance(backend, PyslurmBackend):
                    backend.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    sizes()
    fold(args.runs)
    reason = mariadb_missing_reason() or missing_reason()
    if reason:
        raise SystemExit(f"cannot time the writes: {reason}")
    root = Path(tempfile.mkdtemp(prefix="ingero-bench-mariadb-"))
    try:
        with mariadb_server(root) as db:
            writes("22.05", ("scontrol",), args.runs, db)
            if not (slurm25.pyslurm_missing_reason() or missing_reason(slurm25.PREFIX)):
                writes("25.11", ("scontrol", "pyslurm"), args.runs, db)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
