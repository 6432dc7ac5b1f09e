"""NCCL across ranks end to end on real processes: a late NCCL rank and a hung collective, from the
ranks' processes through ``ingero trace``, ``ingero fleet-push`` and ``ingero fleet`` to
``ingero echo``.

Four ranks of one communicator run against the stand-in libnccl (fake_libnccl.c: NCCL's real
signatures, collectives rendezvous across processes), each a Slurm rank of job 77 (its
environment, and the prolog's job file in its node's jobs directory). Each is traced by its
own real ``ingero trace --pid --record`` into its own node DB, read by its own real ``ingero
fleet-push`` (own node id, same cluster and job), all pushing to one real ``ingero fleet``
that forwards its events to a real ``ingero echo``.

Rank 3 enters every collective 200 ms late: Fleet's ``peer_lag`` names it (node and
comm_rank, lag within 20%), its fleet-push reads the lag from its push replies and raises
``straggler_state`` for ``peer_lag``, and Echo's ``collective_lag`` ranks it first. Then
rank 1 stops before its next collective while the others enter it: Fleet's
``collective_hang`` names rank 1 and its node, never before ``hang_after`` (Fleet's own
figure), and Echo's ``collective_lag`` lists the hang.

Twice: with the collectives blocking inside the call (``in_call``), and as real NCCL runs
on a GPU (``enqueue``): the call returns once the collective is enqueued and the rank
waits for its peers in the stream sync that ends its step (fake_libnccl.c's
FAKE_NCCL_ASYNC, the driver's cuStreamSynchronize), so the ranks waiting in a hang have
returned from the collective.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.echo.helpers import EchoProcess
from tests.integration.push.cluster import Cluster, Procs, wait_for, with_echo
from tests.integration.trace.ranks import (
    JOB,
    collective_lag,
    comm_hash,
    events,
    spawn_ranks,
    trace_push_and_go,
)

pytestmark = pytest.mark.integration

NRANKS, LATE_RANK, DELAY_MS, STOP_RANK = 4, 3, 200, 1
INTERVAL = 0.5  # fleet-push and Fleet
TRACER_INTERVAL = "0.25"
HANG_AFTER = 3.0  # six push intervals


@pytest.fixture
def chain(tmp_path: Path) -> Iterator[tuple[Cluster, EchoProcess]]:
    c = Cluster(
        tmp_path,
        Procs(),
        INTERVAL,
        NRANKS,
        job_id=JOB,
        # A window of 10 joined collectives: about 2 s of a 200 ms late rank.
        fleet_config={"nccl": {"hang_after": f"{HANG_AFTER}s", "window": 10}},
    )
    with with_echo(c) as echo:
        yield c, echo


@pytest.mark.parametrize("mode", ["in_call", "enqueue"])
def test_late_rank_and_hung_collective_from_ranks_to_echo(
    mode: str,
    bpf_ready: None,  # first: skipped before any daemon starts where BPF cannot run
    chain: tuple[Cluster, EchoProcess],
    start_tracer: Any,
    spawn: Any,
    nccl_ranks: Path,
    driver_loop: Path,
) -> None:
    c, echo = chain
    nodes = [c.node(i) for i in range(NRANKS)]
    stop_file = c.tmp / "stop-rank"

    def argv_of(rank: int, env: dict[str, str]) -> list[str]:
        opts = {LATE_RANK: ["-d", str(DELAY_MS)], STOP_RANK: ["-F", str(stop_file)]}
        step = []
        if mode == "enqueue":
            env["FAKE_NCCL_ASYNC"] = "1"
            step = ["-a"]  # each iteration ends in a stream sync, where the rank waits
        # Iterations enough to outlast the test; the ranks are killed by PID after it.
        return [str(nccl_ranks), str(rank), str(NRANKS), "100000", "9", *step,
                *opts.get(rank, [])]  # fmt: skip

    ranks = spawn_ranks(c, spawn, driver_loop, argv_of)
    (comm,) = {comm_hash(proc) for proc in ranks}
    trace_push_and_go(c, ranks, start_tracer, TRACER_INTERVAL)

    # (a) The late rank, and only it, named by Fleet (forwarded to Echo) with its lag.
    (lag,) = wait_for(lambda: events(echo, "peer_lag"), 120, "Fleet's peer_lag in Echo")
    late_node = nodes[LATE_RANK]
    assert (lag["node_id"], lag["job_id"], lag["rank"]) == (late_node, JOB, LATE_RANK), lag
    extra = lag["extra"]
    assert (extra["state"], extra["comm_hash"], extra["comm_rank"], extra["nranks"]) == (
        "start", comm, LATE_RANK, NRANKS
    ), extra  # fmt: skip
    assert extra["op"] == "ncclAllReduce" and extra["clock_offset_known"] is True, extra
    assert extra["lag_p50_ms"] == pytest.approx(DELAY_MS, rel=0.2), extra
    # Its fleet-push read the lag from its push replies (X-Ingero-Peer-Lag) and raised
    # straggler_state for it; no other node did.
    (state,) = wait_for(
        lambda: [e for e in c.events() if e.type == "straggler_state"],
        60,
        "the late node's straggler_state",
    )
    assert state.node_id == late_node and state.job_id == JOB, state
    assert state.extra["reason"] == "peer_lag" and state.dominant_signal == "peer_lag", state
    assert state.extra["peer_lag_s"] == pytest.approx(DELAY_MS / 1e3, rel=0.2), state
    # Echo ranks it first.
    ranked = wait_for(lambda: collective_lag(echo)["ranks"], 30, "collective_lag's ranks")
    first = ranked[0]
    assert (first["node_id"], first["comm_rank"], first["comm_hash"]) == (
        late_node,
        LATE_RANK,
        comm,
    )
    assert first["lag_p50_ms"] == pytest.approx(DELAY_MS, rel=0.2), first

    # (b) Rank 1 stops before its next collective; the others enter it and wait inside.
    stop_file.touch()
    stopped = ranks[STOP_RANK].stdout.readline().strip()
    assert stopped.startswith("stopped="), stopped
    hung_seq = int(stopped.split("=", 1)[1]) + 1
    hang = wait_for(
        lambda: [e for e in events(echo, "collective_hang") if e["extra"]["state"] == "start"],
        120,
        "Fleet's collective_hang in Echo",
    )[0]
    extra = hang["extra"]
    assert (extra["comm_hash"], extra["seq"], extra["op"]) == (comm, hung_seq, "ncclAllReduce")
    assert extra["missing_ranks"] == [STOP_RANK] and extra["missing_nodes"] == [nodes[STOP_RANK]]
    assert hang["node_id"] == nodes[STOP_RANK] and hang["job_id"] == JOB, hang
    assert extra["inside_ranks"] == [r for r in range(NRANKS) if r != STOP_RANK], extra
    # In the call, or returned from it at enqueue and waiting in the stream sync.
    assert extra["in_call_count"] == (NRANKS - 1 if mode == "in_call" else 0), extra
    # Never before the bound (Fleet's own figure: its tick's time minus the ranks' entry).
    # How soon after it depends on when the pushes and ticks run on a loaded host: that it
    # is the first tick past the bound is proven on a simulated clock (unit tests,
    # fleet/test_collectives.py), not here.
    assert extra["inside_for_s"] >= HANG_AFTER, extra
    # Echo lists the hang, open, naming the rank that never entered.
    hangs = wait_for(lambda: collective_lag(echo)["hangs"], 30, "collective_lag's hangs")
    assert [(h["seq"], h["open"], h["missing_ranks"], h["missing_nodes"]) for h in hangs] == [
        (hung_seq, True, [STOP_RANK], [nodes[STOP_RANK]])
    ]
    assert hangs[0]["comm_hash"] == comm and hangs[0]["reason"] == "missing_ranks", hangs[0]
    if mode == "enqueue":
        # A rank waiting in a stream sync looks, on its own node, like a rank that froze
        # after its last call (no in-flight sync is recorded): only Fleet, comparing the
        # ranks, tells the victims from the missing, and its collective_wait tells their
        # fleet-push (test_nccl_lockstep.py proves no waiting rank is flagged).
        return
    # The ranks waiting inside the hung collective launch nothing, but they are its victims,
    # not stragglers: no node-side stall for them (ingero.push.nodestate, "waiting is not
    # stalled"); the rank that never arrived may be flagged as stalled.
    time.sleep(4 * INTERVAL)  # a few more samples of everyone inside
    stalls = {
        e.node_id
        for e in c.events()
        if e.type == "straggler_state" and e.extra.get("reason") == "stall"
    }
    assert stalls <= {nodes[STOP_RANK]}, stalls
