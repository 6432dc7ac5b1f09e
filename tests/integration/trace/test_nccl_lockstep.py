"""A lock-step job on real processes: a rank that waits is not a straggler.

Four ranks of one communicator against the stand-in libnccl in its rendezvous mode as real
NCCL runs on a GPU (fake_libnccl.c, FAKE_NCCL_ASYNC=1): ``ncclAllReduce`` returns at
enqueue and the step's stream sync (the stand-in driver's cuStreamSynchronize) blocks until
every rank has entered the collective. Each rank is traced by its own real ``ingero trace
--pid`` into its own node DB, read by its own real ``ingero fleet-push``, all pushing to one
real ``ingero fleet`` (quorum 3, so the four nodes are judged) that forwards its events to
a real ``ingero echo``.

- Rank 1 stops before its next collective: its three peers enter it and wait in their
  stream sync, launching nothing. Fleet's ``collective_wait`` names rank 1 and its node
  (long before ``hang_after``), the three say they wait (their status, Fleet's gauge) and
  are never flagged; rank 1's node is, as stalled.
- It resumes; then the link goes down (FAKE_NCCL_LINK): every rank enters the collective
  and none completes. One job-level ``collective_wait`` that names no rank; no node is
  flagged.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.echo.helpers import EchoProcess
from tests.integration.push.cluster import Cluster, Procs, wait_for, with_echo
from tests.integration.trace.ranks import JOB, comm_hash, events, spawn_ranks, trace_push_and_go

pytestmark = pytest.mark.integration

NRANKS, STOP_RANK = 4, 1
INTERVAL = 0.5  # fleet-push and Fleet
TRACER_INTERVAL = "0.25"
STEP_MS = 50  # every rank's step: the job runs at 20 steps a second


@pytest.fixture
def chain(tmp_path: Path) -> Iterator[tuple[Cluster, EchoProcess]]:
    c = Cluster(
        tmp_path,
        Procs(),
        INTERVAL,
        NRANKS,
        job_id=JOB,
        fleet_config={
            "quorum": {"statistical_min": 3},  # four nodes: a threshold, so a flag could come
            # half of the 1 s default at half its push interval, as at a 1 s push
            "nccl": {"wait_after": "0.5s", "window": 10},
        },
        # A loaded 2-core host delays tracers and ticks: a waiting node holds its quiet
        # for Fleet's word for 10 samples before it counts as a stall (5 by default).
        push_config={"score": {"collective_wait_samples": 10}},
    )
    with with_echo(c) as echo:
        yield c, echo


def flagged_since(c: Cluster, since: float) -> set[str]:
    return {e.node_id for e in c.events() if e.type == "straggler_state" and e.timestamp >= since}


def waits(echo: EchoProcess, since: float) -> list[dict[str, Any]]:
    return [
        e for e in events(echo, "collective_wait")
        if e["extra"]["state"] == "start" and e["extra"]["since"] >= since - 5
    ]  # fmt: skip


def test_a_hang_flags_only_the_missing_rank_and_a_stop_of_the_whole_job_none(
    bpf_ready: None,  # first: skipped before any daemon starts where BPF cannot run
    chain: tuple[Cluster, EchoProcess],
    start_tracer: Any,
    spawn: Any,
    nccl_ranks: Path,
    driver_loop: Path,
) -> None:
    c, echo = chain
    nodes = [c.node(i) for i in range(NRANKS)]
    stop_file, link_file = c.tmp / "stop-rank", c.tmp / "link-down"

    def argv_of(rank: int, env: dict[str, str]) -> list[str]:
        env["FAKE_NCCL_ASYNC"] = "1"
        env["FAKE_NCCL_LINK"] = str(link_file)
        stop = ["-F", str(stop_file)] if rank == STOP_RANK else []
        return [str(nccl_ranks), str(rank), str(NRANKS), "1000000", "7", "-a",
                "-d", str(STEP_MS), *stop]  # fmt: skip

    ranks = spawn_ranks(c, spawn, driver_loop, argv_of)
    (comm,) = {comm_hash(proc) for proc in ranks}
    trace_push_and_go(c, ranks, start_tracer, TRACER_INTERVAL)
    # Every node warm and judged against Fleet's threshold before anything happens.
    wait_for(lambda: all("fleet" in c.modes(n) for n in nodes), 120, "every node in mode fleet")

    # (a) Rank 1 hangs before its next collective; the others enter it and wait.
    hung_at = time.time()
    stop_file.touch()
    stopped = ranks[STOP_RANK].stdout.readline().strip()
    assert stopped.startswith("stopped="), stopped
    (wait,) = wait_for(lambda: waits(echo, hung_at), 60, "Fleet's collective_wait in Echo")
    extra = wait["extra"]
    assert (extra["comm_hash"], extra["seq"]) == (comm, int(stopped.split("=", 1)[1]) + 1)
    assert extra["missing_ranks"] == [STOP_RANK] and extra["missing_nodes"] == [nodes[STOP_RANK]]
    assert wait["node_id"] == nodes[STOP_RANK] and extra["waiting_count"] == NRANKS - 1
    # Named long before a hang's bound (30 s by default).
    assert extra["waiting_for_s"] < 5, extra
    # Its node, and only its node, is flagged: stalled while the others wait for it.
    stall = wait_for(
        lambda: [e for e in c.events() if e.type == "straggler_state" and e.timestamp >= hung_at],
        60,
        "the missing rank's straggler_state",
    )[0]
    assert stall.node_id == nodes[STOP_RANK] and stall.extra.get("reason") == "stall", stall
    waiting = [n for i, n in enumerate(nodes) if i != STOP_RANK]
    wait_for(
        lambda: all("waiting for rank 1" in c.push_log(n) for n in waiting),
        30,
        "the waiting nodes saying whom they wait for",
    )
    assert c.fleet_metric("ingero_fleet_nccl_waiting_nodes") == NRANKS - 1
    time.sleep(8 * INTERVAL)  # more samples of the three waiting
    assert flagged_since(c, hung_at) == {nodes[STOP_RANK]}

    # It resumes; the job goes on, and the missing rank's episode ends as it works again.
    os.kill(ranks[STOP_RANK].pid, signal.SIGUSR1)
    assert ranks[STOP_RANK].stdout.readline().strip() == "resumed"
    wait_for(
        lambda: [e for e in events(echo, "collective_wait") if e["extra"]["state"] == "end"],
        60,
        "the wait's end",
    )
    wait_for(
        lambda: any(
            e.type == "straggler_resolved" and e.node_id == nodes[STOP_RANK] for e in c.events()
        ),
        60,
        "the missing rank's episode to end",
    )

    # (b) The link goes down: every rank enters the collective, none completes.
    down_at = time.time()
    link_file.touch()
    (stop,) = wait_for(
        lambda: [w for w in waits(echo, down_at) if w["extra"]["missing_ranks"] == []],
        60,
        "a job-level collective_wait naming no rank",
    )
    assert stop["node_id"] == "" and stop["extra"]["waiting_count"] == NRANKS
    assert stop["extra"]["reason"].startswith("all_ranks_waiting")
    time.sleep(8 * INTERVAL)
    assert flagged_since(c, down_at) == set()
    link_file.unlink()
