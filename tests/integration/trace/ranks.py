"""Ranks of job JOB on the stand-in libnccl, each on its own node of a :class:`Cluster`,
traced and pushed as on a real cluster: what the end-to-end NCCL tests share."""

from __future__ import annotations

import json
import os
import urllib.parse
from pathlib import Path
from typing import Any

from ingero.slurm.jobfile import JobInfo, write_job
from ingero.trace.decode import unique_id_hash
from tests.integration.echo.helpers import EchoProcess, http
from tests.integration.push.cluster import Cluster

JOB, CLUSTER = "77", "itest"


def events(echo: EchoProcess, kind: str) -> list[dict[str, Any]]:
    """Echo's stored events of ``kind`` (Fleet's, forwarded), oldest first, extra parsed."""
    query = (
        "SELECT event_id, node_id, job_id, rank, dominant_signal, extra FROM events"
        f" WHERE type = '{kind}' ORDER BY ts"
    )
    status, body = http("POST", echo.url + "/api/v1/sql", json.dumps({"query": query}).encode())
    assert status == 200, body
    rows = [dict(zip(body["columns"], row, strict=True)) for row in body["rows"]]
    for row in rows:
        row["extra"] = json.loads(row["extra"])
    return rows


def collective_lag(echo: EchoProcess) -> dict[str, Any]:
    query = urllib.parse.urlencode({"job_id": JOB, "cluster_id": CLUSTER, "since": 0})
    status, body = http("GET", f"{echo.url}/api/v1/collective_lag?{query}")
    assert status == 200, body
    return dict(body)


def rank_env(c: Cluster, rank: int, rendezvous: Path, driver_loop: Path) -> dict[str, str]:
    """The environment of one rank of job JOB on its node (the prolog's job file written
    there: fleet-push reads its job and rank from it). Each collective launches its kernel
    through the stand-in driver, as NCCL does: fleet-push counts a node without kernel
    launches as idle and classifies it not."""
    nodes = [c.node(i) for i in range(c.nodes)]
    write_job(c.jobs_dir(rank), JobInfo(JOB, CLUSTER, nodes[rank], rank, c.nodes, nodes))
    return dict(os.environ, FAKE_NCCL_DIR=str(rendezvous), SLURM_JOB_ID=JOB,
                FAKE_NCCL_LIBCUDA=str(driver_loop.parent / "libcuda.so.1"),
                SLURM_PROCID=str(rank), INGERO_JOBS_DIR=str(c.jobs_dir(rank)))  # fmt: skip


def comm_hash(proc: Any) -> str:
    """Communicator 1's hash (as the tracer writes it) from the rank's id lines."""
    ids = {}
    while (line := proc.stdout.readline().strip()) != "ready":
        assert line, f"rank exited before it was ready: {proc.stderr.read()}"
        name, value = line.split("=", 1)
        ids[name] = value
    return f"{unique_id_hash(bytes.fromhex(ids['id1'])):016x}"


def spawn_ranks(c: Cluster, spawn: Any, driver_loop: Path, argv_of: Any) -> list[Any]:
    """One process per rank (``argv_of(rank, env)`` its command line; it may add to its
    environment), each with its node's job file, all meeting in one rendezvous directory."""
    rendezvous = c.tmp / "rendezvous"
    rendezvous.mkdir()
    ranks = []
    for rank in range(c.nodes):
        env = rank_env(c, rank, rendezvous, driver_loop)
        ranks.append(spawn(argv_of(rank, env), env=env))
    return ranks


def trace_push_and_go(c: Cluster, ranks: list[Any], start_tracer: Any, interval: str) -> None:
    """A real ``ingero trace --pid`` per rank into its node's DB, Fleet, the sink and a
    fleet-push per node; then every rank is told to start its collectives."""
    for rank, proc in enumerate(ranks):
        start_tracer("--pid", str(proc.pid), interval=interval, db=c.tmp / f"{c.node(rank)}.db")
    c.start_fleet()
    c.start_sink()
    for rank in range(c.nodes):
        c.start_push(rank)
    for proc in ranks:
        proc.stdin.write("go\n")
        proc.stdin.flush()
