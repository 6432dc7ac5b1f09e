"""explain: a collective a rank is still inside, read from a node DB written as the tracer
writes one during a hang (real SQLite, the tracer's own writer)."""

from __future__ import annotations

from pathlib import Path

import sqlite_utils

from ingero.explain.analysis import explain
from ingero.explain.hung import HUNG_MIN_S, hung_findings
from ingero.explain.reader import read_in_flight, read_window_data
from ingero.nodedb.schema import connect
from ingero.nodedb.writer import Batch, write_batch
from ingero.schema.stacks import Frame, Stack

COMM = "00000000000000ab"
LINE = Stack((Frame("py", function="all_reduce", file="/job/train.py", line=88),))


def _comm(pid: int, comm_rank: int, ts: float, entered: int, returned: int,
          inflight: int | None, since: float | None) -> dict[str, object]:  # fmt: skip
    return {"ts": ts, "pid": pid, "job_id": "7", "rank": comm_rank, "comm_hash": COMM,
            "comm_rank": comm_rank, "nranks": 3, "calls": 1, "entered_seq": entered,
            "returned_seq": returned, "last_enter_ts": since, "inflight_seq": inflight,
            "inflight_op": None if inflight is None else "ncclAllReduce",
            "inflight_since": since, "wait_ns": 0, "sampled": 1, "dropped": 0}  # fmt: skip


def _call(pid: int, seq: int, enter: float, back: float | None) -> dict[str, object]:
    return {"ts_enter": enter, "ts_return": back, "pid": pid, "tid": pid, "job_id": "7",
            "rank": 0, "comm_hash": COMM, "comm_rank": 0, "nranks": 3, "seq": seq,
            "op": "ncclAllReduce", "bytes": 4096, "ret": None if back is None else 0,
            "stack_key": LINE.key()}  # fmt: skip


def _hang_db(path: Path | str = ":memory:") -> sqlite_utils.Database:
    """Ranks 0 and 1 (pids 10, 11) inside collective 5 since t=100; rank 2 (pid 12) never
    entered it. Pid 10's collective 3 was written in flight and completed since."""
    db = connect(path)
    stack = {"stack_key": LINE.key(), "frames": LINE.dumps(), "first_seen": 100.0,
             "last_seen": 101.0}  # fmt: skip
    write_batch(db, Batch(nccl_calls=[_call(10, 3, 90.0, None)], stacks=[stack]))
    write_batch(db, Batch(nccl_returns=[{"pid": 10, "comm_hash": COMM, "seq": 3,
                                         "ts_enter": 90.0, "ts_return": 91.0, "ret": 0}]))  # fmt: skip
    write_batch(db, Batch(nccl_calls=[_call(10, 5, 100.0, None), _call(11, 5, 100.2, None)]))
    comms = [_comm(10, 0, ts, 5, 4, 5, 100.0) for ts in (101.0, 102.0, 107.0)]
    comms += [_comm(11, 1, 107.0, 5, 4, 5, 100.2), _comm(12, 2, 107.0, 4, 4, None, None)]
    write_batch(db, Batch(nccl_comms=comms))
    return db


def test_a_hung_rank_is_named_with_its_line_and_the_rank_it_waits_for(tmp_path: Path) -> None:
    db = _hang_db(tmp_path / "node.db")
    calls, ranks = read_in_flight(db, 107.0, 10.0, None)
    # Collective 5, on both ranks that entered it (3 returned: its row was completed).
    assert sorted((c.state.pid, c.seq, round(c.in_flight_s, 3)) for c in calls) == [
        (10, 5, 7.0), (11, 5, 6.8)]  # fmt: skip
    assert all(c.stack == LINE for c in calls)
    found = hung_findings(calls, ranks, {10: "python", 11: "python"})
    assert [f.subject for f in found] == ["pid 10", "pid 11"]  # the first to arrive first
    first = found[0]
    assert first.kind == "nccl_hung" and first.evidence is not None
    assert first.message == (
        "rank 0 (pid 10, python) has been inside ncclAllReduce #5 of communicator 00000000"
        " for 7 s (since 00:01:40 UTC), called in `all_reduce` at `job/train.py:88`;"
        " not entered by rank 2 (pid 12), at #4"
    )
    assert (first.evidence["seq"], first.evidence["stack_key"]) == (5, LINE.key())
    assert first.evidence["not_entered_by"] == [{"pid": 12, "comm_rank": 2, "entered_seq": 4}]
    # Ranked first in the report: a hang outweighs what changed.
    path = tmp_path / "node.db"
    report = explain(read_window_data(db, path, 107.0, 10.0, None),
                     read_window_data(db, path, 97.0, 10.0, None), 10.0, also=found)  # fmt: skip
    assert report.findings[0] == first
    assert (
        report.findings[0].as_dict()["evidence"]["where"] == "in `all_reduce` at `job/train.py:88`"
    )


def test_a_short_wait_or_a_window_before_the_hang_names_nothing() -> None:
    db = _hang_db()
    # At 101 the call had been in flight 1 s on pid 10 only; before it, nothing at all.
    calls, ranks = read_in_flight(db, 101.0, 10.0, None)
    assert [(c.state.pid, c.in_flight_s) for c in calls] == [(10, 1.0)]
    assert [f.subject for f in hung_findings(calls, ranks, {})] == ["pid 10"]
    short = [c for c in calls if c.in_flight_s < HUNG_MIN_S]
    assert hung_findings(short, ranks, {}) == []
    assert read_in_flight(db, 99.0, 5.0, None) == ([], [])
    assert read_in_flight(connect(":memory:"), 107.0, 10.0, None) == ([], [])
