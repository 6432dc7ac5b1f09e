"""collectives: the fold of NCCL arrivals/returns into nccl_calls and nccl_comms rows.

Table-driven: each case is a script of samples (as the kernel delivers them: numbered at
entry per process and communicator handle) and the rows expected at the interval's end.
"""

from __future__ import annotations

from typing import Any

import pytest

from ingero.trace.aggregate import Tags
from ingero.trace.collectives import Collectives, NcclRows
from ingero.trace.decode import KIND_CALL, KIND_COMM_INIT, KIND_ENTER, KIND_EXIT, TraceEvent
from ingero.trace.ops import OP_IDS

P, T, T2 = 100, 101, 102  # pid and two of its threads
A, B = 0xA000, 0xB000  # communicator handles
HA, HB, HA2 = 0xAA, 0xBB, 0xA2  # their hashes (HA2: comm A re-created with a new id)
TAGS = {P: Tags("1234", 3)}


def run(script: list[tuple[Any, ...]], sample_max: int = 1024) -> list[NcclRows]:
    """Apply the script; each ("close", ts) step yields that interval's rows."""
    fold = Collectives(sample_max)
    hashes = {A: HA, B: HB}
    out = []
    for step, *args in script:
        if step == "init":  # (handle, hash)
            hashes[args[0]] = args[1]
            fold.comm_init(P, args[0], args[1], 0, 4)
        elif step == "enter":  # (tid, ts, handle, seq, op)
            tid, ts, h, seq, op = args
            fold.enter(P, tid, ts, h, hashes[h], 0, 4, seq, op, 4000)
        elif step == "leave":  # (tid, ts, handle, seq[, duration_ns])
            tid, ts, h, seq, *dur = args
            fold.leave(P, tid, ts, dur[0] if dur else 0, h, hashes[h], 0, 4, seq,
                       "ncclAllReduce", 4000, 0)  # fmt: skip
        elif step == "gs":
            fold.group_start(P, args[0])
        elif step == "ge":  # (tid, ts)
            fold.group_end(P, args[0], args[1])
        elif step == "destroy":
            fold.comm_destroy(P, args[0])
        elif step == "exit":
            fold.exit(P)
        elif step == "close":
            out.append(fold.close(args[0], TAGS))
    return out


def comms(rows: NcclRows, *cols: str) -> dict[str, tuple[object, ...]]:
    return {str(r["comm_hash"]): tuple(r[c] for c in cols) for r in rows.comms}


def calls(rows: NcclRows, *cols: str) -> list[tuple[object, ...]]:
    return sorted(tuple(r[c] for c in cols) for r in rows.calls)  # type: ignore[misc]


HEX_A, HEX_B, HEX_A2 = (f"{h:016x}" for h in (HA, HB, HA2))
STATE = ("calls", "entered_seq", "returned_seq", "inflight_seq", "inflight_op", "inflight_since")

# A nested group of two collectives on thread T, closed by its inner end only.
NESTED: list[tuple[Any, ...]] = [
    ("gs", T),
    ("enter", T, 1.0, A, 1, "ncclAllReduce"),
    ("leave", T, 1.01, A, 1),
    ("gs", T),
    ("enter", T, 1.02, A, 2, "ncclAllGather"),
    ("leave", T, 1.03, A, 2),
    ("ge", T, 1.04),
]

CASES: dict[str, tuple[list[tuple[Any, ...]], dict[str, tuple[object, ...]]]] = {
    "plain calls return in order": (
        [
            ("enter", T, 1.0, A, 1, "ncclAllReduce"),
            ("leave", T, 1.1, A, 1),
            ("enter", T, 1.2, A, 2, "ncclBroadcast"),
            ("leave", T, 1.5, A, 2),
            ("close", 2.0),
        ],
        {HEX_A: (2, 2, 2, None, None, None)},
    ),
    "a call in flight at the interval's end": (
        [
            ("enter", T, 1.0, A, 1, "ncclAllReduce"),
            ("leave", T, 1.1, A, 1),
            ("enter", T, 1.7, A, 2, "ncclAllGather"),
            ("close", 2.0),
        ],
        {HEX_A: (2, 2, 1, 2, "ncclAllGather", 1.7)},
    ),
    "group calls stay in flight until the outermost group end": (
        [
            *NESTED,  # the inner end launches nothing yet
            ("close", 2.0),
        ],
        {HEX_A: (2, 2, 0, 1, "ncclAllReduce", 1.0)},
    ),
    "the outermost group end returns every call of the group": (
        [
            *NESTED,
            ("ge", T, 1.5),
            ("close", 2.0),
        ],
        {HEX_A: (2, 2, 2, None, None, None)},
    ),
    "a group on one thread does not hold another thread's calls": (
        [
            ("gs", T),
            ("enter", T, 1.0, A, 1, "ncclAllReduce"),
            ("leave", T, 1.01, A, 1),
            ("enter", T2, 1.1, B, 1, "ncclBroadcast"),
            ("leave", T2, 1.2, B, 1),
            ("close", 2.0),
        ],
        {HEX_A: (1, 1, 0, 1, "ncclAllReduce", 1.0), HEX_B: (1, 1, 1, None, None, None)},
    ),
    "several communicators are numbered independently": (
        [
            ("enter", T, 1.0, A, 1, "ncclAllReduce"),
            ("leave", T, 1.1, A, 1),
            ("enter", T, 1.2, B, 1, "ncclBroadcast"),
            ("leave", T, 1.3, B, 1),
            ("enter", T, 1.4, A, 2, "ncclAllReduce"),
            ("leave", T, 1.5, A, 2),
            ("enter", T, 1.6, B, 2, "ncclBroadcast"),
            ("close", 2.0),
        ],
        {HEX_A: (2, 2, 2, None, None, None), HEX_B: (2, 2, 1, 2, "ncclBroadcast", 1.6)},
    ),
    "destroyed and re-created: a last row for the old one, the new one from 1": (
        [
            ("enter", T, 1.0, A, 1, "ncclAllReduce"),
            ("leave", T, 1.1, A, 1),
            ("enter", T, 1.2, A, 2, "ncclAllReduce"),
            ("leave", T, 1.3, A, 2),
            ("destroy", A),
            ("init", A, HA2),  # same address handed out again
            ("enter", T, 1.5, A, 1, "ncclAllReduce"),
            ("leave", T, 1.6, A, 1),
            ("close", 2.0),
        ],
        {HEX_A: (2, 2, 2, None, None, None), HEX_A2: (1, 1, 1, None, None, None)},
    ),
    "a lost return sample does not leave the call hanging": (
        [
            ("enter", T, 1.0, A, 1, "ncclAllReduce"),  # its return sample was dropped
            ("enter", T, 1.2, A, 2, "ncclAllReduce"),
            ("leave", T, 1.3, A, 2),
            ("close", 2.0),
        ],
        {HEX_A: (2, 2, 2, None, None, None)},
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_state_per_communicator(name: str) -> None:
    script, want = CASES[name]
    (rows,) = run(script)
    assert comms(rows, *STATE) == want


def test_rows_carry_tags_hash_and_times() -> None:
    (rows,) = run([("enter", T, 1.0, A, 1, "ncclAllReduce"), ("leave", T, 1.25, A, 1),
                   ("enter", T, 1.5, A, 2, "ncclAllReduce"), ("close", 2.0)])  # fmt: skip
    (comm,) = rows.comms
    assert {k: comm[k] for k in ("ts", "pid", "job_id", "rank", "comm_hash", "comm_rank",
                                 "nranks", "last_enter_ts", "wait_ns", "sampled", "dropped")} == {
        "ts": 2.0, "pid": P, "job_id": "1234", "rank": 3, "comm_hash": "00000000000000aa",
        "comm_rank": 0, "nranks": 4, "last_enter_ts": 1.5, "wait_ns": 250_000_000,
        "sampled": 2, "dropped": 0}  # fmt: skip
    # The returned call is written now; the one in flight waits for its return.
    assert calls(rows, "seq", "ts_enter", "ts_return", "op", "bytes", "ret", "tid") == [
        (1, 1.0, 1.25, "ncclAllReduce", 4000, 0, T)]  # fmt: skip


def test_a_call_in_flight_is_written_the_next_interval_with_its_return() -> None:
    first, second, third = run([
        ("enter", T, 1.0, A, 1, "ncclAllReduce"), ("close", 2.0),
        ("leave", T, 2.5, A, 1), ("close", 3.0),
        ("close", 4.0),
    ])  # fmt: skip
    assert first.calls == []
    assert calls(second, "seq", "ts_enter", "ts_return") == [(1, 1.0, 2.5)]
    assert comms(second, "calls", "returned_seq", "inflight_seq", "wait_ns") == {
        HEX_A: (0, 1, None, 1_500_000_000)}  # fmt: skip
    assert third.calls == []


def test_a_hung_call_keeps_its_arrival_time_and_is_written_once() -> None:
    rows = run([("enter", T, 1.0, A, 7, "ncclAllReduce"), ("close", 2.0), ("close", 3.0),
                ("close", 4.0)])  # fmt: skip
    assert [comms(r, "inflight_seq", "inflight_since", "ts") for r in rows] == [
        {HEX_A: (7, 1.0, ts)} for ts in (2.0, 3.0, 4.0)]  # fmt: skip
    written = [c for r in rows for c in r.calls]
    assert [(c["seq"], c["ts_return"]) for c in written] == [(7, None)]


def test_a_hung_call_written_in_flight_is_completed_when_it_returns() -> None:
    """In flight for a whole interval: written then with ts_return NULL (while it hangs);
    its later return completes that row (NcclRows.returns), no second row is written."""
    rows = run([("enter", T, 1.0, A, 7, "ncclAllReduce"), ("close", 2.0), ("close", 3.0),
                ("close", 4.0), ("leave", T, 4.5, A, 7), ("close", 5.0), ("close", 6.0)])  # fmt: skip
    assert [calls(r, "seq", "ts_enter", "ts_return", "stack_key") for r in rows] == [
        [], [(7, 1.0, None, None)], [], [], []]  # fmt: skip
    assert [r.returns for r in rows] == [[], [], [], [{
        "pid": P, "comm_hash": HEX_A, "seq": 7, "ts_enter": 1.0, "ts_return": 4.5, "ret": 0}],
        []]  # fmt: skip
    assert comms(rows[3], "returned_seq", "inflight_seq") == {HEX_A: (7, None)}


def test_a_call_crossing_an_interval_end_costs_one_write_and_no_update() -> None:
    rows = run([("enter", T, 1.9, A, 1, "ncclAllReduce"), ("close", 2.0),
                ("leave", T, 2.1, A, 1), ("close", 3.0), ("close", 4.0)])  # fmt: skip
    assert [calls(r, "seq", "ts_return") for r in rows] == [[], [(1, 2.1)], []]
    assert [r.returns for r in rows] == [[], [], []]


def test_a_hung_group_is_completed_at_its_outermost_end() -> None:
    rows = run([*NESTED, ("close", 2.0), ("close", 3.0), ("ge", T, 3.5), ("close", 4.0)])
    assert calls(rows[1], "seq", "ts_return") == [(1, None), (2, None)]
    assert [(r["seq"], r["ts_return"]) for r in rows[2].returns] == [(1, 3.5), (2, 3.5)]
    assert rows[2].calls == []


def test_a_row_in_flight_is_forgotten_when_its_call_leaves_unseen() -> None:
    # The thread's next call says the hung one returned (its return sample lost): the row
    # keeps ts_return NULL, and nothing about it is remembered or completed.
    rows = run([("enter", T, 1.0, A, 1, "ncclAllReduce"), ("close", 2.0), ("close", 3.0),
                ("enter", T, 3.5, A, 2, "ncclAllReduce"), ("leave", T, 3.6, A, 2),
                ("leave", T, 3.7, A, 1), ("close", 4.0)])  # fmt: skip
    assert calls(rows[1], "seq", "ts_return") == [(1, None)]
    assert calls(rows[2], "seq", "ts_return") == [(2, 3.6)]
    assert rows[2].returns == []


def test_rows_remembered_in_flight_are_bounded_by_the_sample_cap() -> None:
    fold = Collectives(sample_max=2)
    for tid in range(5):  # five threads, each hung in its own call
        fold.enter(P, tid, 1.0 + tid / 10, A, HA, 0, 4, tid + 1, "ncclAllReduce", 8)
    fold.close(2.0, TAGS)
    assert [c["seq"] for c in fold.close(3.0, TAGS).calls] == [2, 4, 5]  # stride 2, the last
    for tid in range(5):
        fold.leave(P, tid, 4.0, 0, A, HA, 0, 4, tid + 1, "ncclAllReduce", 8, 0)
    assert [r["seq"] for r in fold.close(5.0, TAGS).returns] == [4, 5]  # the newest 2


def test_the_last_interval_writes_the_calls_still_in_flight() -> None:
    fold = Collectives()
    fold.enter(P, T, 1.5, A, HA, 0, 4, 1, "ncclAllReduce", 8)
    assert fold.close(2.0, TAGS, final=True).calls[0]["ts_return"] is None


def test_group_return_time_is_the_outermost_end() -> None:
    (rows,) = run([*NESTED, ("ge", T, 1.5), ("close", 2.0)])
    assert calls(rows, "seq", "ts_return") == [(1, 1.5), (2, 1.5)]


def test_a_lost_arrival_is_rebuilt_from_the_return() -> None:
    (rows,) = run([("leave", T, 1.5, A, 3, 500_000_000), ("close", 2.0)])
    assert calls(rows, "seq", "ts_enter", "ts_return") == [(3, 1.0, 1.5)]
    assert comms(rows, "calls", "entered_seq", "returned_seq") == {HEX_A: (1, 3, 3)}


def test_destroyed_and_exited_communicators_leave_after_their_last_row() -> None:
    rows = run([("enter", T, 1.0, A, 1, "ncclAllReduce"), ("destroy", A), ("close", 2.0),
                ("enter", T, 2.1, B, 1, "ncclBroadcast"), ("exit",), ("close", 3.0),
                ("close", 4.0)])  # fmt: skip
    assert [sorted(comms(r)) for r in rows] == [[HEX_A], [HEX_B], []]
    # The destroyed communicator's call in flight is written with it, not kept forever.
    assert calls(rows[0], "seq", "ts_return") == [(1, None)]


def _many(n: int, handle: int = A) -> list[tuple[Any, ...]]:
    script: list[tuple[Any, ...]] = []
    for seq in range(1, n + 1):
        ts = 1.0 + seq * 1e-4
        script += [("enter", T, ts, handle, seq, "ncclAllReduce"), ("leave", T, ts, handle, seq)]
    return script


@pytest.mark.parametrize(
    ("n", "stride"), [(1024, 1), (1025, 2), (2049, 2), (2050, 4), (3001, 4), (100_000, 128)]
)
def test_sampling_keeps_a_power_of_two_stride_under_the_cap(n: int, stride: int) -> None:
    (rows,) = run([*_many(n), ("close", 9.0)])
    seqs = [c[0] for c in calls(rows, "seq")]
    want = sorted({s for s in range(1, n + 1) if s % stride == 0} | {n})
    assert seqs == want
    assert len(seqs) <= 1024 + 1
    (row,) = rows.comms
    assert (row["calls"], row["sampled"], row["dropped"]) == (n, len(want), n - len(want))


def test_sampled_numbers_are_shared_by_ranks_with_different_rates() -> None:
    (slow,) = run([*_many(2000), ("close", 9.0)])
    (fast,) = run([*_many(2100), ("close", 9.0)])
    slow_seqs = {c[0] for c in calls(slow, "seq")}
    fast_seqs = {c[0] for c in calls(fast, "seq")}
    # Strides 2 and 4: every number the faster rank keeps (but its last) the slower keeps too.
    assert {s for s in fast_seqs if s <= 2000} - {2100} <= slow_seqs
    assert len(slow_seqs & fast_seqs) == 500


def test_sample_max_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Collectives(0)


def _ev(kind: int, op: str, ts_seq: int = 0, **kw: int) -> TraceEvent:
    f = dict(ts_ns=0, duration_ns=0, bytes=8, comm_hash=HA, comm=A, seq=ts_seq, pid=P, tid=T,
             op_id=OP_IDS[op], ret=0, rank=0, nranks=4, dtype=7, kind=kind)  # fmt: skip
    f.update(kw)
    return TraceEvent(**f)


def test_feed_dispatches_kernel_samples() -> None:
    fold = Collectives()
    fold.feed(_ev(KIND_COMM_INIT, "ncclCommInitRank"), 0.5)
    fold.feed(_ev(KIND_CALL, "ncclGroupStart", comm_hash=0, comm=0, rank=-1), 0.9)
    fold.feed(_ev(KIND_ENTER, "ncclAllReduce", 1), 1.0)
    fold.feed(_ev(KIND_CALL, "ncclAllReduce", 1), 1.1)
    # Point-to-point calls carry no number and are not collectives.
    fold.feed(_ev(KIND_CALL, "ncclSend"), 1.2)
    fold.feed(_ev(KIND_CALL, "ncclRecv"), 1.3)
    rows = fold.close(2.0, TAGS)
    assert comms(rows, *STATE) == {HEX_A: (1, 1, 0, 1, "ncclAllReduce", 1.0)}
    fold.feed(_ev(KIND_CALL, "ncclGroupEnd", comm_hash=0, comm=0, rank=-1), 2.5)
    rows = fold.close(3.0, TAGS)
    assert comms(rows, *STATE) == {HEX_A: (0, 1, 1, None, None, None)}
    fold.feed(_ev(KIND_CALL, "ncclCommDestroy"), 3.5)
    fold.feed(_ev(KIND_EXIT, "ncclAllReduce"), 3.6)
    assert [sorted(comms(r)) for r in (fold.close(4.0, TAGS), fold.close(5.0, TAGS))] == [
        [HEX_A], []]  # fmt: skip


def test_a_collective_keeps_its_arrivals_stack() -> None:
    """The arrival carries the stack, the return none: the return's raw event gets the
    arrival's key, and a call that never returns keeps it on its row too."""
    fold = Collectives()
    fold.feed(_ev(KIND_COMM_INIT, "ncclCommInitRank"), 0.5)
    assert fold.feed(_ev(KIND_ENTER, "ncclAllReduce", 1), 1.0, "site-a") == "site-a"
    assert fold.feed(_ev(KIND_CALL, "ncclAllReduce", 1), 1.1) == "site-a"
    fold.feed(_ev(KIND_ENTER, "ncclAllReduce", 2), 1.2, "site-b")  # never returns
    fold.feed(_ev(KIND_EXIT, "ncclAllReduce"), 1.5)
    rows = fold.close(2.0, TAGS)
    assert [(c["seq"], c["ts_return"] is None, c["stack_key"]) for c in rows.calls] == [
        (1, False, "site-a"), (2, True, "site-b")]  # fmt: skip
    # A return with a stack of its own (its arrival sample lost) keeps that one.
    fold.feed(_ev(KIND_COMM_INIT, "ncclCommInitRank"), 2.5)
    assert fold.feed(_ev(KIND_CALL, "ncclAllReduce", 1), 3.0, "site-c") == "site-c"
