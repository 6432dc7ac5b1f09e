"""The stack of the rank everyone waits for, end to end on real processes: from a hung
collective through ``ingero trace``, ``ingero fleet-push``, ``ingero fleet`` and ``ingero
echo``, to ``ingero explain`` across the nodes over SSH.

Three ranks of one communicator run against the stand-in libnccl (fake_libnccl.c), each a
Slurm rank of job 77 on its own node: ranks 0 and 1 are nccl_ranks.c, rank 2 is a CPython
process (py_rank.py) calling the library through ctypes. Each is traced by its own real
``ingero trace --pid --record``, read by its own real ``ingero fleet-push``. Rank 2 stops
before a collective and waits in ``wait_for_batch`` (its data loader), the others enter the
collective and wait inside: Fleet's ``collective_hang`` names rank 2's node, its push reply
says so, and that node's fleet-push takes one snapshot of its job's stacks (py-spy
--nonblocking) under the hang's ``event_id``. The snapshot names the function and the line
being executed (and its caller's), arrives in Echo under the hang's id, where
``collective_lag`` answers with it, and ``explain --nodes`` (the path ``--job-nodes`` takes)
shows it. Twice: with rank 2 asleep in Python, and frozen there with SIGSTOP (py-spy reads it
without attaching).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ingero.push.stack_snapshot import Target, dump, find_py_spy
from tests.integration.echo.helpers import EchoProcess
from tests.integration.fanout.sshd import missing_reason, ssh_nodes
from tests.integration.push.cluster import Cluster, Procs, wait_for, with_echo
from tests.integration.trace.ranks import (
    JOB,
    collective_lag,
    comm_hash,
    events,
    spawn_ranks,
    trace_push_and_go,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(find_py_spy() is None, reason="py-spy is not installed"),
]

NRANKS, PY_RANK = 3, 2
INTERVAL = 0.5
HANG_AFTER = 3.0
PY_RANK_SCRIPT = Path(__file__).with_name("py_rank.py")
INGERO = str(Path(sys.prefix) / "bin" / "ingero")


def line_of(marker: str) -> int:
    lines = PY_RANK_SCRIPT.read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if marker in text)


WAIT_LINE, TRAIN_LINE = line_of("WAIT_LINE"), line_of("TRAIN_LINE")


@pytest.fixture
def chain(tmp_path: Path) -> Iterator[tuple[Cluster, EchoProcess]]:
    c = Cluster(
        tmp_path,
        Procs(),
        INTERVAL,
        NRANKS,
        job_id=JOB,
        fleet_config={"nccl": {"hang_after": f"{HANG_AFTER}s", "window": 10}},
        # The missing rank's node may first be a stalled straggler (its own snapshot):
        # the hang's must not wait the default gap behind it.
        push_config={"snapshot": {"min_gap": "1s"}},
    )
    with with_echo(c) as echo:
        yield c, echo


def py_collectives(db: Path) -> int:
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            return int(conn.execute("SELECT count(*) FROM nccl_calls").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error:
        return 0


def in_wait_for_batch(pid: int) -> bool:
    threads = dump(Target(pid), py_spy=find_py_spy())
    return any(
        t.stack.frames[:1] and t.stack.frames[0].function == "wait_for_batch" for t in threads
    )


@pytest.mark.parametrize("frozen", [False, True], ids=["asleep", "sigstop"])
def test_the_missing_rank_stack_from_its_node_to_echo_and_explain(
    frozen: bool,
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
        if rank == PY_RANK:
            return [sys.executable, str(PY_RANK_SCRIPT), str(nccl_ranks.parent / "libnccl.so.2"),
                    str(rank), str(NRANKS), "9", str(stop_file)]  # fmt: skip
        return [str(nccl_ranks), str(rank), str(NRANKS), "100000", "9"]

    ranks = spawn_ranks(c, spawn, driver_loop, argv_of)
    (comm,) = {comm_hash(proc) for proc in ranks[:PY_RANK]}
    py = ranks[PY_RANK]
    assert py.stdout.readline().strip() == "ready", py.stderr.read()
    trace_push_and_go(c, ranks, start_tracer, str(INTERVAL / 2))
    # Collectives flow through every rank: the Python rank's traced calls are in its node DB.
    wait_for(lambda: py_collectives(c.tmp / f"{nodes[PY_RANK]}.db") >= 20, 60, "rank 2's calls")
    try:
        stop_file.touch()
        stopped = py.stdout.readline().strip()
        assert stopped.startswith("stopped="), (stopped, py.stderr.read())
        hung_seq = int(stopped.split("=", 1)[1]) + 1
        wait_for(lambda: in_wait_for_batch(py.pid), 30, "rank 2 in wait_for_batch")
        if frozen:
            os.kill(py.pid, signal.SIGSTOP)
        _check(c, echo, comm, hung_seq, py.pid)
    finally:
        os.kill(py.pid, signal.SIGCONT)


def _check(c: Cluster, echo: EchoProcess, comm: str, hung_seq: int, pid: int) -> None:
    node = c.node(PY_RANK)
    (hang,) = wait_for(
        lambda: [e for e in events(echo, "collective_hang") if e["extra"]["state"] == "start"],
        120,
        "Fleet's collective_hang in Echo",
    )
    assert (hang["extra"]["comm_hash"], hang["extra"]["seq"]) == (comm, hung_seq), hang
    assert hang["extra"]["missing_ranks"] == [PY_RANK], json.dumps(hang)
    # Fleet names the node only of a rank it has had a report from: on a loaded machine
    # node02's first collective push can come after the hang begins ([] then). Its push
    # reply names it all the same once that report comes (fleet/collectives.py), which the
    # snapshot under the hang's id below proves.
    assert hang["extra"]["missing_nodes"] in ([node], []), hang
    # The node's snapshot, under the hang's id, in Echo.
    (snap,) = wait_for(
        lambda: [e for e in events(echo, "stack_snapshot") if e["event_id"] == hang["event_id"]],
        60,
        "rank 2's stack_snapshot in Echo under the hang's id",
    )
    extra = snap["extra"]
    assert snap["node_id"] == node and snap["rank"] == PY_RANK, snap
    assert (extra["trigger"], extra["op"], extra["seq"]) == (
        "collective_hang",
        "ncclAllReduce",
        hung_seq,
    ), extra
    assert extra["for_s"] >= HANG_AFTER, extra
    # The main thread is the one whose tid is the pid; py-spy names it where it could read
    # the threading module's names (not always, for a process asleep or frozen).
    main = next(s for s in extra["stacks"] if s["pid"] == pid and s.get("tid") == pid)
    assert main.get("thread") in (None, "MainThread"), main
    assert main["rank"] == PY_RANK and "reason" not in main, main
    where = [(f["function"], f["file"], f["line"]) for f in main["frames"][:2]]
    assert where == [
        ("wait_for_batch", str(PY_RANK_SCRIPT), WAIT_LINE),
        ("train", str(PY_RANK_SCRIPT), TRAIN_LINE),
    ], main
    # Echo's answer is that stack.
    answer = (
        f"the job is hung in ncclAllReduce #{hung_seq}; rank {PY_RANK} on {node} has been in"
        f" wait_for_batch at {PY_RANK_SCRIPT}:{WAIT_LINE} ← train at {PY_RANK_SCRIPT}:{TRAIN_LINE}"
    )
    (stuck,) = wait_for(lambda: collective_lag(echo)["hangs"], 30, "collective_lag's hangs")
    assert stuck["answer"].startswith(answer), stuck["answer"]
    # Only one snapshot for the hang, however many pushes its reply named the node in.
    assert (
        len([e for e in events(echo, "stack_snapshot") if e["event_id"] == hang["event_id"]]) == 1
    )
    # explain on the node, and across the nodes over SSH (as --job-nodes runs it).
    db = c.tmp / f"{node}.db"
    local = subprocess.run(
        [INGERO, "explain", "--db", str(db), "--json"], capture_output=True, text=True, timeout=120
    )
    assert local.returncode == 0, local.stderr
    assert json.loads(local.stdout)["stack_snapshot"]["event_id"] == hang["event_id"]
    if missing_reason() is not None:
        return
    dbs = {c.node(i): c.tmp / f"{c.node(i)}.db" for i in range(NRANKS)}
    with ssh_nodes(c.tmp / "ssh", dbs) as ssh:
        across = subprocess.run(
            [INGERO, "explain", "--nodes", ",".join(dbs), "--ssh-options", ssh.ssh_options,
             "--remote-ingero", INGERO],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
    assert across.returncode == 0, across.stderr
    assert f"   stack: {answer}" in across.stdout, across.stdout
