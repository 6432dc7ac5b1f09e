"""NCCL collective numbering, arrival lag and hung collectives through the real tracer.

The ranks run against the stand-in libnccl (fake_libnccl.c, NCCL's real signatures): its
collectives rendezvous across processes, so a late rank makes the others wait inside the
call and a rank that stops leaves the others blocked in it. Each rank is traced by its own
``ingero trace --pid`` writing its own node DB, as one node each.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ingero.trace.decode import unique_id_hash
from tests.integration.trace.conftest import finish, wait_rows

pytestmark = pytest.mark.integration


def _query(db: Path, sql: str, *args: object) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def _ids(proc: subprocess.Popen[str]) -> dict[str, str]:
    """The id lines a rank prints before it waits: name → comm hash (as the DB writes it)."""
    ids = {}
    assert proc.stdout is not None
    while (line := proc.stdout.readline().strip()) != "ready":
        assert line, "the rank exited before it was ready"
        name, value = line.split("=", 1)
        ids[name] = f"{unique_id_hash(bytes.fromhex(value)):016x}"
    return ids


ITERS, GROUP_EVERY, RECREATE_AFTER = 12, 3, 6


def test_numbering_groups_communicators_and_recreate(
    start_tracer: Any, spawn: Any, nccl_ranks: Path
) -> None:
    # One rank of one: groups every 3rd iteration (2 collectives, nested), a second
    # communicator, send/recv, and comm 1 destroyed and re-created after 6 iterations.
    workload = spawn([str(nccl_ranks), "0", "1", str(ITERS), "5", "-g", str(GROUP_EVERY), "-2",
                      "-p", "-x", str(RECREATE_AFTER)])  # fmt: skip
    ids = _ids(workload)
    tracer = start_tracer("--pid", str(workload.pid))
    out = finish(workload)
    assert out["recreated_after"] == "8" and out["comm1_collectives"] == "8"
    assert out["same_handle"] == "1"  # re-created at the old one's address
    sql = "SELECT MAX(returned_seq) FROM nccl_comms WHERE comm_hash = ?"
    assert wait_rows(tracer.db, sql, (ids["id2"],), ITERS, tracer.notify) == ITERS
    code, err = tracer.stop()
    assert code == 0, err

    # Per communicator: every collective numbered 1..n in issue order; send/recv are not.
    ops_one = ["ncclAllReduce", "ncclAllReduce", "ncclAllReduce", "ncclAllGather"] * 2
    want = {ids["id1"]: ops_one, ids["id3"]: ops_one, ids["id2"]: ["ncclBroadcast"] * ITERS}
    for comm_hash, ops in want.items():
        rows = _query(tracer.db, "SELECT seq, op FROM nccl_calls WHERE comm_hash = ? "
                      "ORDER BY seq", comm_hash)  # fmt: skip
        assert rows == list(enumerate(ops, 1)), comm_hash
        (final,) = _query(tracer.db, "SELECT SUM(calls), MAX(entered_seq), MAX(returned_seq), "
                          "SUM(dropped) FROM nccl_comms WHERE comm_hash = ?", comm_hash)  # fmt: skip
        assert final == (len(ops), len(ops), len(ops), 0), comm_hash
    assert _query(tracer.db, "SELECT COUNT(*) FROM nccl_calls WHERE op IN "
                  "('ncclSend', 'ncclRecv')") == [(0,)]  # fmt: skip
    assert _query(tracer.db, "SELECT COUNT(*) FROM raw_events WHERE op = 'ncclSend'") == [(ITERS,)]
    # A group's collectives return together, at the outermost ncclGroupEnd, which the
    # workload reaches only after sleeping 20 ms inside the group.
    for comm_hash in (ids["id1"], ids["id3"]):
        groups = _query(tracer.db, "SELECT seq, ts_enter, ts_return FROM nccl_calls "
                        "WHERE comm_hash = ? AND seq IN (3, 4, 7, 8) ORDER BY seq", comm_hash)  # fmt: skip
        for (_, enter_a, ret_a), (_, enter_b, ret_b) in (groups[0:2], groups[2:4]):
            assert ret_a == ret_b
            assert ret_a - enter_b >= 0.02
            assert enter_a < enter_b < ret_a
    # Nothing is left in flight, and the raw events carry the numbers too.
    assert _query(tracer.db, "SELECT COUNT(*) FROM nccl_comms WHERE inflight_seq IS NOT NULL "
                  "AND ts = (SELECT MAX(ts) FROM nccl_comms)") == [(0,)]  # fmt: skip
    assert _query(tracer.db, "SELECT COUNT(*) FROM raw_events WHERE op = 'ncclBroadcast' "
                  "AND json_extract(detail, '$.seq') IS NOT NULL") == [(ITERS,)]  # fmt: skip


NRANKS, LATE_RANK, DELAY_MS, STOP_RANK, STOP_BEFORE = 4, 3, 200, 1, 12


def test_late_rank_lag_and_hung_collective(
    start_tracer: Any, spawn: Any, nccl_ranks: Path, tmp_path: Path
) -> None:
    env = dict(os.environ, FAKE_NCCL_DIR=str(tmp_path))
    ranks = []
    for rank in range(NRANKS):
        opts = {LATE_RANK: ["-d", str(DELAY_MS)], STOP_RANK: ["-S", str(STOP_BEFORE)]}
        ranks.append(spawn([str(nccl_ranks), str(rank), str(NRANKS), "100", "9",
                            *opts.get(rank, [])], env=env))  # fmt: skip
    comm = _ids(ranks[0])["id1"]
    for proc in ranks[1:]:
        _ids(proc)
    tracers = [start_tracer("--pid", str(proc.pid)) for proc in ranks]
    for proc in ranks:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    assert ranks[STOP_RANK].stdout.readline().strip() == f"stopped={STOP_BEFORE - 1}"
    # The others are now inside collective STOP_BEFORE: let a few intervals show it.
    hung = "SELECT COUNT(*) FROM nccl_comms WHERE inflight_seq = ?"
    for rank, tracer in enumerate(tracers):
        if rank != STOP_RANK:
            assert wait_rows(tracer.db, hung, (STOP_BEFORE,), 4, tracer.notify) >= 4, rank
    for tracer in tracers:
        code, err = tracer.stop()
        assert code == 0, err

    # Every rank numbers the same collectives alike: one comm hash, seq → the same op.
    enter: dict[int, dict[int, float]] = {}
    for rank, tracer in enumerate(tracers):
        rows = _query(tracer.db, "SELECT seq, op, comm_hash, comm_rank, nranks, ts_enter "
                      "FROM nccl_calls ORDER BY seq")  # fmt: skip
        want_seqs = STOP_BEFORE - 1 if rank == STOP_RANK else STOP_BEFORE
        assert [r[0] for r in rows] == list(range(1, want_seqs + 1)), rank
        assert {r[1:5] for r in rows} == {("ncclAllReduce", comm, rank, NRANKS)}, rank
        enter[rank] = {r[0]: r[5] for r in rows}

    # The late rank's arrival lags the median of the others by the injected delay.
    lags = [
        enter[LATE_RANK][seq] - statistics.median(enter[r][seq] for r in enter if r != LATE_RANK)
        for seq in range(2, STOP_BEFORE)  # the first is skewed by the start
    ]
    assert statistics.median(lags) == pytest.approx(DELAY_MS / 1000, rel=0.2), lags
    for rank in enter:
        if rank != LATE_RANK:
            others = [enter[rank][s] - enter[LATE_RANK][s] for s in range(2, STOP_BEFORE)]
            assert statistics.median(others) < 0, rank  # everyone else arrives first

    # The rank that stopped entered STOP_BEFORE - 1 and has nothing in flight; the others
    # are inside STOP_BEFORE since one moment, for longer and longer.
    for rank, tracer in enumerate(tracers):
        rows = _query(tracer.db, "SELECT ts, entered_seq, returned_seq, inflight_seq, "
                      "inflight_op, inflight_since FROM nccl_comms ORDER BY ts")  # fmt: skip
        last = rows[-1]
        if rank == STOP_RANK:
            assert last[1:5] == (STOP_BEFORE - 1, STOP_BEFORE - 1, None, None), rank
            continue
        stuck = [r for r in rows if r[3] == STOP_BEFORE]
        assert len(stuck) >= 4, rank
        assert {r[1:5] for r in stuck} == {(STOP_BEFORE, STOP_BEFORE - 1, STOP_BEFORE,
                                            "ncclAllReduce")}, rank  # fmt: skip
        assert len({r[5] for r in stuck}) == 1, rank  # the arrival, not a moving time
        ages = [r[0] - r[5] for r in stuck]
        assert ages == sorted(ages) and ages[-1] > ages[0], rank
        assert stuck[0][5] == enter[rank][STOP_BEFORE], rank


def test_finish_is_not_needed_by_a_rank_that_ran_to_the_end(spawn: Any, nccl_ranks: Path) -> None:
    # The stand-in alone (no tracer): a single rank without a rendezvous directory runs
    # through and reports what it issued, so the tests above read its numbers correctly.
    proc = spawn([str(nccl_ranks), "0", "1", "4", "1", "-g", "2"])
    _ids(proc)
    assert finish(proc)["comm1_collectives"] == "6"


PY_RANK = Path(__file__).parent / "py_nccl.py"


def test_a_collective_carries_its_callers_stack_from_its_arrival(
    start_tracer: Any, spawn: Any, nccl_ranks: Path, tmp_path: Path
) -> None:
    """A CPython rank's allreduce that returns, then one its peer never enters: both
    nccl_calls rows (the hung one too, which has no return) and the returned call's raw
    event name the Python line that called the collective, and its ctypes caller."""
    env = dict(os.environ, FAKE_NCCL_DIR=str(tmp_path))
    lib = nccl_ranks.parent / "libnccl.so.2"
    rank0 = spawn([sys.executable, str(PY_RANK), str(lib), "9", "2", "0"], env=env)
    assert rank0.stdout.readline().strip() == "ready"
    rank1 = spawn([str(nccl_ranks), "1", "2", "5", "9", "-S", "2"], env=env)
    _ids(rank1)
    tracer = start_tracer("--pid", str(rank0.pid))
    for proc in (rank0, rank1):
        proc.stdin.write("go\n")
        proc.stdin.flush()
    assert rank1.stdout.readline().strip() == "stopped=1"
    marks = {k: int(v) for k, v in (kv.split("=") for kv in rank0.stdout.readline().split())}
    hung = "SELECT COUNT(*) FROM nccl_comms WHERE inflight_seq = 2"
    assert wait_rows(tracer.db, hung, (), 2, tracer.notify) >= 2
    code, err = tracer.stop()
    assert code == 0, err[-2000:]

    calls = _query(tracer.db, "SELECT n.seq, n.ts_return, s.frames FROM nccl_calls n "
                   "LEFT JOIN stacks s USING (stack_key) ORDER BY n.seq")  # fmt: skip
    assert [(seq, ret is None) for seq, ret, _ in calls] == [(1, False), (2, True)]
    want = {1: [("step", marks["step"]), ("train", marks["train_step"])],
            2: [("hang", marks["hang"]), ("train", marks["train_hang"])]}  # fmt: skip
    for seq, _, frames in calls:
        assert frames is not None, seq  # the hung call's stack came with its arrival
        stack = json.loads(frames)
        py = [(f["function"], f["line"]) for f in stack["frames"] if f["kind"] == "py"]
        assert py == [*want[seq], ("<module>", marks["module"])], stack
        # The collective's caller, not the collective itself, is the innermost frame.
        assert "libffi" in (stack["frames"][0].get("lib") or ""), stack
        assert "reason" not in stack, stack
    raw = _query(tracer.db, "SELECT r.stack_key, n.stack_key FROM raw_events r JOIN nccl_calls n "
                 "ON n.seq = 1 WHERE r.op = 'ncclAllReduce' AND r.pid = ?", rank0.pid)  # fmt: skip
    assert len(raw) == 1 and raw[0][0] is not None and raw[0][0] == raw[0][1]


HANG_AT, HANG_ITERS = 3, 6


def test_a_hung_collective_is_in_the_node_db_while_it_hangs_then_completed(
    start_tracer: Any, spawn: Any, nccl_ranks: Path, tmp_path: Path
) -> None:
    """Rank 1 stops before collective HANG_AT, so the traced rank 0 hangs inside it: read
    while the tracer still runs, the node DB holds that call (ts_return NULL) with the stack
    it was called from; once rank 1 goes on, the same row gets its return, no second one."""
    env = dict(os.environ, FAKE_NCCL_DIR=str(tmp_path))
    rank0 = spawn([str(nccl_ranks), "0", "2", str(HANG_ITERS), "9"], env=env)
    rank1 = spawn([str(nccl_ranks), "1", "2", str(HANG_ITERS), "9", "-S", str(HANG_AT)], env=env)
    comm = _ids(rank0)["id1"]
    _ids(rank1)
    tracer = start_tracer("--pid", str(rank0.pid))
    for proc in (rank0, rank1):
        proc.stdin.write("go\n")
        proc.stdin.flush()
    assert rank1.stdout.readline().strip() == f"stopped={HANG_AT - 1}"
    hung = "SELECT COUNT(*) FROM nccl_calls WHERE seq = ? AND ts_return IS NULL"
    assert wait_rows(tracer.db, hung, (HANG_AT,), 1, tracer.notify) == 1
    assert tracer.proc.poll() is None  # read during the hang, not at the tracer's stop
    row = "SELECT n.rowid, n.comm_hash, n.ts_enter, n.ts_return, n.ret, n.stack_key, s.frames "
    row += "FROM nccl_calls n LEFT JOIN stacks s USING (stack_key) WHERE n.seq = ?"
    ((rowid, comm_hash, enter, back, ret, key, frames),) = _query(tracer.db, row, HANG_AT)
    assert (comm_hash, back, ret) == (comm, None, None)
    assert key is not None and frames is not None  # its arrival's stack, written before it
    stack = json.loads(frames)
    assert [f.get("function") for f in stack["frames"][:1]] == ["main"], stack  # the caller
    assert "nccl_ranks" in (stack["frames"][0].get("lib") or ""), stack
    # explain, on the node DB the tracer is writing, names the hung call and its line.
    long = "SELECT COUNT(*) FROM nccl_comms WHERE inflight_seq = ? AND ts - inflight_since > 1.5"
    assert wait_rows(tracer.db, long, (HANG_AT,), 1, tracer.notify) >= 1
    report = json.loads(subprocess.run(
        [sys.executable, "-m", "ingero.cli.main", "explain", "--json", "--db", str(tracer.db),
         "--window", "10s", "--until", "latest"],
        capture_output=True, text=True, timeout=120, check=True).stdout)  # fmt: skip
    finding = report["findings"][0]
    assert (finding["kind"], finding["subject"]) == ("nccl_hung", f"pid {rank0.pid}"), finding
    evidence = finding["evidence"]
    assert (evidence["seq"], evidence["comm_hash"], evidence["stack_key"]) == (HANG_AT, comm, key)
    assert evidence["where"].startswith("in `main` (nccl_ranks)"), evidence
    assert tracer.proc.poll() is None

    os.kill(rank1.pid, signal.SIGUSR1)  # the late rank arrives: the collective completes
    assert rank1.stdout.readline().strip() == "resumed"
    for proc in (rank0, rank1):
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    done = "SELECT COUNT(*) FROM nccl_calls WHERE seq = ? AND ts_return IS NOT NULL"
    assert wait_rows(tracer.db, done, (HANG_AT,), 1, tracer.notify) == 1
    code, err = tracer.stop()
    assert code == 0, err[-2000:]
    rows = _query(tracer.db, "SELECT rowid, seq, ts_enter, ts_return, ret, stack_key "
                  "FROM nccl_calls ORDER BY seq")  # fmt: skip
    assert [r[1] for r in rows] == list(range(1, HANG_ITERS + 1))  # one row per call
    (completed,) = [r for r in rows if r[1] == HANG_AT]
    assert completed[0] == rowid and completed[2] == enter and completed[5] == key
    assert completed[3] > enter and completed[4] == 0
