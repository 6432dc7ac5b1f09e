"""The node DB's NCCL tables into CommReports: pure building, then the reader on real SQLite."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from ingero.nodedb.schema import connect
from ingero.otlp.collectives import MAX_CALLS, CollectiveCall, sample_calls
from ingero.otlp.health import NodePush, decode_health, encode_health
from ingero.push.collectives import CollectivesReader, build_reports
from tests.nccl_db import add_calls, add_comms, nccl_node_db, rank_interval

H1, H2 = "0123456789abcdef", "fedcba9876543210"
NOW = 1_700_000_100.0


def comm(pid: int = 10, h: str = H1, r: int = 0, ts: float = NOW, **kw: Any) -> dict[str, Any]:
    return {
        "pid": pid,
        "comm_hash": h,
        "comm_rank": r,
        "ts": ts,
        "nranks": 4,
        "entered_seq": 7,
        "returned_seq": 6,
        "last_enter_ts": NOW - 0.5,
        "inflight_seq": 7,
        "inflight_op": "ncclAllReduce",
        "inflight_since": NOW - 0.5,
        "calls": 3,
        "wait_ns": 5,
        "dropped": 1,
        **kw,
    }


def call(seq: int, pid: int = 10, h: str = H1, r: int = 0, **kw: Any) -> dict[str, Any]:
    return {
        "pid": pid,
        "comm_hash": h,
        "comm_rank": r,
        "seq": seq,
        "op": "ncclAllReduce",
        "ts_enter": NOW - 1 + seq / 100,
        "ts_return": NOW - 1 + seq / 100 + 0.001,
        "bytes": 1024,
        "nranks": 4,
        **kw,
    }


# (name, comm rows, pids alive, (comm_hash, rank) reported)
KEPT = [
    ("alive and fresh", [comm()], {10}, [(H1, 0)]),
    ("dead but from the last interval", [comm()], set(), [(H1, 0)]),
    ("dead and older than an interval", [comm(ts=NOW - 6)], set(), []),
    ("alive and older than an interval", [comm(ts=NOW - 6)], {10}, [(H1, 0)]),
    (
        "two ranks of one communicator in two processes, one dead",
        [comm(pid=10, r=0, ts=NOW - 6), comm(pid=11, r=1, ts=NOW - 6)],
        {11},
        [(H1, 1)],
    ),
]


@pytest.mark.parametrize(("name", "comms", "alive", "want"), KEPT, ids=[k[0] for k in KEPT])
def test_ranks_kept_while_their_process_lives_or_the_row_is_fresh(
    name: str, comms: list[dict[str, Any]], alive: set[int], want: list[tuple[str, int]]
) -> None:
    got = build_reports(comms, [], now=NOW, fresh_s=5.0, pid_alive=alive.__contains__)
    assert [(c.comm_hash, c.comm_rank) for c in got] == want


def test_report_fields_times_in_ns_and_calls_in_seq_order_once() -> None:
    calls = [call(3), call(1), call(2), call(2, op="ncclBroadcast"), call(1, h=H2)]
    (report,) = build_reports(
        [comm()], calls, now=NOW, fresh_s=5.0, pid_alive=lambda _: True, unsent={(10, H1, 0): 4}
    )
    assert [c.seq for c in report.calls] == [1, 2, 3]
    assert report.calls[1].op == "ncclBroadcast"  # the row written last wins
    assert report.calls[0] == CollectiveCall(
        1, "ncclAllReduce", round((NOW - 0.99) * 1e9), round((NOW - 0.989) * 1e9), 1024
    )
    assert (report.entered_seq, report.returned_seq, report.nranks) == (7, 6, 4)
    assert report.inflight_since_ns == round((NOW - 0.5) * 1e9)
    assert (report.calls_in_interval, report.wait_ns, report.dropped) == (3, 5, 1 + 4)


def reader(path: Path, alive: set[int] | None = None, max_calls: int = 16384) -> CollectivesReader:
    return CollectivesReader(
        path,
        interval_s=5.0,
        recent_intervals=3,
        max_calls_read=max_calls,
        pid_alive=(alive or {10, 11}).__contains__,
    )


def test_a_node_db_without_the_nccl_tables_or_at_all_gives_none(tmp_path: Path) -> None:
    assert reader(tmp_path / "absent.db").read(NOW) == ()
    connect(tmp_path / "node.db").conn.close()  # a node DB of an older tracer
    assert reader(tmp_path / "node.db").read(NOW) == ()
    (tmp_path / "junk.db").write_bytes(b"not a database at all, really" * 100)
    assert reader(tmp_path / "junk.db").read(NOW) == ()


def test_each_push_reads_the_calls_written_since_the_previous_one(tmp_path: Path) -> None:
    db = nccl_node_db(tmp_path / "node.db")
    spec = {"pid": 10, "comm_hash": H1, "comm_rank": 0, "nranks": 2, "period": 0.01}
    # Written long ago: older than the first push's interval, never read.
    rank_interval(db, end=NOW - 20, first_seq=1, count=10, **spec)  # type: ignore[arg-type]
    rank_interval(db, end=NOW, first_seq=11, count=100, **spec)  # type: ignore[arg-type]
    r = reader(tmp_path / "node.db")
    # The first push has no previous one to count from: the rank's state, no calls.
    (first,) = r.read(NOW)
    assert first.entered_seq == 110 and first.calls == () and first.calls_in_interval == 0
    rank_interval(db, end=NOW + 1, first_seq=111, count=50, **spec)  # type: ignore[arg-type]
    (one,) = r.read(NOW + 1)
    assert [c.seq for c in one.calls] == list(range(111, 161))
    assert one.entered_seq == 160 and one.calls_in_interval == 50 and one.dropped == 0
    # Nothing new: the rank is still reported (its row is recent), with no calls.
    (idle,) = r.read(NOW + 2)
    assert idle.calls == () and idle.calls_in_interval == 0 and idle.entered_seq == 160
    # A call the tracer wrote late, entered before the previous push, is read once; two
    # tracer intervals within one push are summed.
    add_calls(db, [call(161, ts_enter=NOW + 0.9, ts_return=NOW + 0.95)])
    rank_interval(db, end=NOW + 4, first_seq=162, count=30, **spec)  # type: ignore[arg-type]
    rank_interval(db, end=NOW + 5, first_seq=192, count=30, **spec)  # type: ignore[arg-type]
    (second,) = r.read(NOW + 5)
    assert [c.seq for c in second.calls] == list(range(161, 222))
    assert second.calls_in_interval == 60 and second.entered_seq == 221
    db.close()


def test_a_burst_is_read_bounded_newest_first_and_the_rest_counted_dropped(tmp_path: Path) -> None:
    db = nccl_node_db(tmp_path / "node.db")
    spec = {"comm_hash": H1, "nranks": 2, "period": 0.0001, "end": NOW, "count": 3000}
    add_comms(db, [comm(pid=10, r=0, ts=NOW - 1), comm(pid=11, r=1, ts=NOW - 1)])
    r = reader(tmp_path / "node.db", max_calls=1000)
    r.read(NOW - 1)  # the first push: the ranks' state only
    rank_interval(db, pid=10, comm_rank=0, first_seq=1, **spec)  # type: ignore[arg-type]
    rank_interval(db, pid=11, comm_rank=1, first_seq=1, **spec)  # type: ignore[arg-type]
    reports = {c.comm_rank: c for c in r.read(NOW)}
    # Rank 1 was written last: its newest 1,000 were read (and sampled down to what the
    # push can carry); rank 0's calls were all older.
    read = [CollectiveCall(s, "ncclAllReduce", 0) for s in range(2001, 3001)]
    assert [c.seq for c in reports[1].calls] == [c.seq for c in sample_calls(read)]
    assert reports[1].dropped == 3000 - len(reports[1].calls)
    assert reports[0].calls == () and reports[0].dropped == 3000
    db.close()


# (name, seqs the tracer sampled in one interval)
SAMPLINGS = [
    ("fits", list(range(1, 65))),
    ("one too many", list(range(1, 66))),
    ("dense thousand", list(range(7, 1007))),
    ("tracer stride 4 plus its last", [*range(4, 4000, 4), 4001]),
    ("last is a multiple", list(range(1, 1025))),
    ("sparse and huge", [1 << k for k in range(30, 40)] + list(range(3, 200, 2))),
]


@pytest.mark.parametrize(("name", "seqs"), SAMPLINGS, ids=[s[0] for s in SAMPLINGS])
def test_the_reader_samples_in_sql_exactly_as_the_encoder_does(
    tmp_path: Path, name: str, seqs: list[int]
) -> None:
    db = nccl_node_db(tmp_path / "node.db")
    add_comms(db, [comm(ts=NOW - 1)])
    r = reader(tmp_path / "node.db")
    r.read(NOW - 1)
    add_calls(db, [call(s, ts_enter=NOW - 0.5) for s in seqs])
    (report,) = r.read(NOW)
    calls = [CollectiveCall(s, "ncclAllReduce", 0) for s in sorted(seqs)]
    assert [c.seq for c in report.calls] == [c.seq for c in sample_calls(calls, MAX_CALLS)]
    assert report.dropped == len(seqs) - len(report.calls)


def test_stale_communicators_drop_out_and_a_replaced_db_starts_over(tmp_path: Path) -> None:
    path = tmp_path / "node.db"
    db = nccl_node_db(path)
    add_comms(db, [comm(ts=NOW - 16, h=H2), comm(ts=NOW - 1)])
    r = reader(path)
    assert [c.comm_hash for c in r.read(NOW)] == [H1]  # 16 s > 3 intervals of 5 s
    add_calls(db, [call(s) for s in range(1, 50)])
    assert len(r.read(NOW)[0].calls) == 49
    add_calls(db, [call(s, ts_enter=NOW + 3) for s in range(50, 53)])
    db.close()
    path.unlink()
    db = nccl_node_db(path)  # a fresh DB: its rowids start again below the cursor
    add_comms(db, [comm(ts=NOW + 4)])
    add_calls(db, [call(s, ts_enter=NOW + 3) for s in range(60, 62)])
    # Fewer rows than the cursor: a new DB, whose first push is the ranks' state only.
    (fresh,) = r.read(NOW + 5)
    assert fresh.calls == () and fresh.calls_in_interval == 0
    add_calls(db, [call(62, ts_enter=NOW + 5.5)])
    assert [c.seq for c in r.read(NOW + 6)[0].calls] == [62]
    db.close()


def test_a_locked_or_broken_table_costs_one_warning_and_no_reports(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "node.db"
    db = nccl_node_db(path)
    db.execute("DROP TABLE nccl_comms")
    db.execute("CREATE TABLE nccl_comms (ts REAL)")  # not the tracer's columns
    db.commit()
    r = reader(path)
    assert r.read(NOW) == () and r.read(NOW + 5) == ()
    assert len([m for m in caplog.messages if "cannot read NCCL tables" in m]) == 1
    db.close()


def test_a_row_no_tracer_writes_costs_the_report_not_the_push(tmp_path: Path) -> None:
    db = nccl_node_db(tmp_path / "node.db")
    add_comms(db, [comm(nranks="many")])  # SQLite keeps what it is given
    assert reader(tmp_path / "node.db").read(NOW) == ()
    db.close()


def test_eight_ranks_round_trip_through_the_health_push_sharing_sampled_seqs(
    tmp_path: Path,
) -> None:
    db = nccl_node_db(tmp_path / "node.db")
    for rank in range(8):
        # Slightly different counts per rank: power-of-two sampling still shares seqs.
        rank_interval(
            db, end=NOW, pid=100 + rank, comm_hash=H1, comm_rank=rank, nranks=8,
            first_seq=1, count=1000 + rank, period=0.004,
        )  # fmt: skip
    r = CollectivesReader(
        tmp_path / "node.db", interval_s=5.0, recent_intervals=3, max_calls_read=16384,
        pid_alive=lambda _: True,
    )  # fmt: skip
    r.read(NOW - 5)
    for rank in range(8):
        rank_interval(
            db, end=NOW, pid=100 + rank, comm_hash=H1, comm_rank=rank, nranks=8,
            first_seq=1001 + rank, count=1000 + rank, period=0.004,
        )  # fmt: skip
    reports = r.read(NOW)
    assert len(reports) == 8
    push = NodePush(node_id="n", cluster_id="c", score=0.9, collectives=reports)
    request = encode_health(push, int(NOW * 1e9))
    decoded = decode_health(ExportMetricsServiceRequest.FromString(request.SerializeToString()))
    assert decoded.messages == []
    (got,) = decoded.pushes
    assert len(got.collectives) == 8
    seqs = [{c.seq for c in comm.calls[:-1]} for comm in got.collectives]
    assert all(len(c.calls) <= MAX_CALLS for c in got.collectives)
    # Rank 0 reached 2000, the last every rank reached: each rank's calls end there, and
    # one stride picks the same multiples from every rank's (nearly equal) window.
    assert all(c.calls[-1].seq == 2000 for c in got.collectives)
    assert len(set.intersection(*seqs)) >= len(seqs[-1]) - 1
    stride = min(b - a for s in seqs for a, b in itertools.pairwise(sorted(s)))
    assert all(s % stride == 0 for s in set.union(*seqs)) and len(set.union(*seqs)) < 64
    # Rank r's 2r calls past 2000 wait for the next push; the rest are sampled or dropped.
    assert all(
        c.dropped + len(c.calls) + 2 * c.comm_rank == c.calls_in_interval for c in got.collectives
    )
    assert [c.calls_in_interval for c in got.collectives] == [1000 + r for r in range(8)]
    later = {c.comm_rank: c for c in r.read(NOW + 5)}
    for rank in range(8):
        assert [c.seq for c in later[rank].calls] == list(range(2001, 2001 + 2 * rank))
        assert later[rank].dropped == 0
    db.close()


# (name, steps: "p" a push, "wR" rank R's next tracer interval of 200 calls written in its
# own commits, as a tracer that writes ranks apart would; pushes whose both ranks carry calls)
INTERLEAVINGS = [
    ("in step", "p w0 w1 p w0 w1 p p", 2),
    ("rank 1 written after every push read rank 0", "p w0 w1 w0 p w1 w0 p w1 w0 p w1 p p", 4),
    ("rank 0 written after every push read rank 1", "p w1 w0 w1 p w0 w1 p w0 p p", 3),
    ("a push between every write", "p w0 p w1 p w0 p w1 p w0 w1 w0 p w1 p p", 3),
    ("rank 1 stops", "p w0 w1 w0 p w0 p w0 p p", 1),
]


@pytest.mark.parametrize(
    ("name", "steps", "both"), INTERLEAVINGS, ids=[i[0] for i in INTERLEAVINGS]
)
def test_ranks_of_a_push_share_their_sampled_seqs_however_their_rows_interleave(
    tmp_path: Path, name: str, steps: str, both: int
) -> None:
    """Two ranks of one communicator on the node, in lockstep; their rows reach the node DB
    apart. Every push that carries both ranks' calls carries the same sequence numbers for
    each, and every call written after the first push is sent or counted dropped once."""
    db = nccl_node_db(tmp_path / "node.db")
    r = CollectivesReader(
        tmp_path / "node.db", interval_s=1.0, recent_intervals=3, max_calls_read=16384,
        pid_alive=lambda _: True,
    )  # fmt: skip
    written = {0: 0, 1: 0}  # intervals written per rank
    covered = {0: 0, 1: 0}  # calls sampled or counted dropped per rank, after the first push
    pushes: list[dict[int, list[int]]] = []
    for step in steps.split():
        if step == "p":
            reports = r.read(NOW + max(written.values()) + 0.5)
            got = {c.comm_rank: [call.seq for call in c.calls] for c in reports}
            if pushes:
                for c in reports:
                    covered[c.comm_rank] += len(c.calls) + c.dropped
            pushes.append(got)
            continue
        rank = int(step[1])
        rank_interval(
            db, end=NOW + written[rank] + 1, pid=10 + rank, comm_hash=H1, comm_rank=rank,
            nranks=2, first_seq=1 + 200 * written[rank], count=200, period=1 / 200,
        )  # fmt: skip
        written[rank] += 1
    together = [p for p in pushes if p.get(0) and p.get(1)]
    assert len(together) == both
    for push in together:
        assert push[0] == push[1]
    assert covered == {rank: 200 * written[rank] for rank in (0, 1)}
    db.close()
