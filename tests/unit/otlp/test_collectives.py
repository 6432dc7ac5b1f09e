"""The NCCL collective report in the health push: round trips, bounds, refusals, sampling."""

from __future__ import annotations

import struct
from dataclasses import fields

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from ingero.otlp import collectives as c
from ingero.otlp.health import NodePush, decode_health, encode_health
from ingero.otlp.values import attributes_dict

T0 = 1_700_000_000_000_000_000


def call(seq: int, late: int = 0, returned: bool = True) -> c.CollectiveCall:
    entered = T0 + seq * 10_000_000 + late
    return c.CollectiveCall(
        seq, "ncclAllReduce", entered, entered + 1_000_000 if returned else None, 4096
    )


def comm(calls: tuple[c.CollectiveCall, ...] = (), **kw: object) -> c.CommReport:
    base: dict[str, object] = {
        "comm_hash": "0123456789abcdef",
        "comm_rank": 3,
        "nranks": 8,
        "entered_seq": calls[-1].seq if calls else 0,
        "returned_seq": calls[-1].seq if calls else 0,
        "calls_in_interval": len(calls),
        "calls": calls,
    }
    base.update(kw)
    return c.CommReport(**base)  # type: ignore[arg-type]


def round_trip(push: NodePush, packed: bool = True) -> NodePush:
    request = encode_health(push, T0, nccl_packed=packed)
    decoded = decode_health(request, details=False, rates=True)
    assert decoded.rejected == 0, decoded.messages
    (out,) = decoded.pushes
    # The decoder builds both without __init__ (ingero.otlp.build): every field, no other.
    assert set(vars(out)) == {f.name for f in fields(NodePush)}
    for report in out.collectives:
        assert set(vars(report)) == {f.name for f in fields(c.CommReport)}
    return out


def test_a_push_without_collectives_decodes_as_before() -> None:
    out = round_trip(NodePush("n1", "c1", 0.9))
    assert out.collectives == () and out.clock is None


@pytest.mark.parametrize(
    "report",
    [
        comm(),
        comm(tuple(call(s) for s in range(1, 11))),
        comm(
            (call(1), call(2), call(3, returned=False)),
            returned_seq=2,
            inflight_seq=3,
            inflight_op="ncclAllReduce",
            inflight_since_ns=T0 + 30_000_000,
            last_enter_ns=T0 + 30_000_000,
            wait_ns=123_456,
            dropped=7,
        ),
    ],
)
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "arrays"])
def test_every_field_of_a_communicator_comes_back(report: c.CommReport, packed: bool) -> None:
    clock = c.ClockOffset(-0.0123, 0.0004)
    push = NodePush("n1", "c1", 0.9, job_id="7", collectives=(report,), clock=clock)
    out = round_trip(push, packed)
    assert out.collectives == (report,)
    assert out.clock == clock


def _comm_attributes(request: ExportMetricsServiceRequest) -> dict[str, object]:
    metric = next(
        m for m in request.resource_metrics[0].scope_metrics[0].metrics if m.name == c.COMM_METRIC
    )
    return attributes_dict(metric.gauge.data_points[0].attributes)


def test_the_calls_go_packed_in_one_bytes_value_the_arrays_only_on_request() -> None:
    calls = (call(1), call(2, returned=False), c.CollectiveCall(3, "ncclBroadcast", T0, T0, 8))
    push = NodePush("n1", "c1", 0.9, collectives=(comm(calls),))
    packed = _comm_attributes(encode_health(push, T0))
    assert not {c.ATTR_SEQS, c.ATTR_ENTERED, c.ATTR_RETURNED, c.ATTR_OPS, c.ATTR_BYTES} & set(
        packed
    )
    assert len(packed[c.ATTR_PACKED]) == 3 * c.PACKED_CALL_BYTES  # type: ignore[arg-type]
    assert packed[c.ATTR_PACKED_OPS] == ["ncclAllReduce", "ncclBroadcast"]
    arrays = _comm_attributes(encode_health(push, T0, nccl_packed=False))
    assert arrays[c.ATTR_SEQS] == [1, 2, 3] and c.ATTR_PACKED not in arrays


def test_a_push_is_bounded_whatever_the_rate() -> None:
    calls = tuple(call(s) for s in range(1, 5001))
    many = tuple(comm(calls, comm_hash=f"{i:016x}") for i in range(100))
    out = round_trip(NodePush("n1", "c1", 0.9, collectives=many))
    assert len(out.collectives) == c.MAX_COMMS
    assert sum(len(r.calls) for r in out.collectives) <= c.MAX_CALLS_PER_PUSH
    for report in out.collectives:
        assert len(report.calls) <= c.MAX_CALLS
        assert report.calls[-1].seq == 5000  # the last one is always there
        assert report.dropped == 5000 - len(report.calls)


def test_sampled_seqs_of_ranks_with_different_counts_share_a_stride() -> None:
    a = c.sample_calls([call(s) for s in range(1, 1001)])
    b = c.sample_calls([call(s) for s in range(1, 1041)])
    common = {x.seq for x in a} & {x.seq for x in b}
    assert len(common) >= c.MAX_CALLS // 2 - 1


# (name, each rank's seqs, the limit per rank)
RANK_SEQS = [
    ("one needs a stride, one fits", [range(1, 101), range(50, 101)], 64),
    ("counts a little apart", [range(1, 1001), range(1, 1041)], 64),
    ("a rank four times as long", [range(1, 257), range(1, 1025)], 64),
    ("the limit of a crowded push", [range(1, 129), range(1, 100), range(60, 129)], 16),
]


@pytest.mark.parametrize(("name", "ranks", "limit"), RANK_SEQS, ids=[r[0] for r in RANK_SEQS])
def test_ranks_of_a_communicator_in_one_push_keep_the_same_multiples(
    name: str, ranks: list[range], limit: int
) -> None:
    """The encoder samples the ranks of one communicator with one stride: each keeps at
    most ``limit``, and every rank keeps exactly the multiples of that stride it has."""
    reports = [comm(tuple(call(s) for s in seqs), comm_rank=i) for i, seqs in enumerate(ranks)]
    crowd = [comm(comm_hash=f"{i:016x}", comm_rank=0) for i in range(1024 // limit - len(ranks))]
    out = round_trip(NodePush("n1", "c1", 0.9, collectives=(*reports, *crowd)))
    got = [r for r in out.collectives if r.comm_hash == reports[0].comm_hash]
    stride = c.shared_stride([list(seqs) for seqs in ranks], limit)
    assert stride > 1
    for seqs, report in zip(ranks, got, strict=True):
        assert 0 < len(report.calls) <= limit
        kept = [x.seq for x in report.calls]
        assert kept == [*(s for s in seqs[:-1] if s % stride == 0), seqs[-1]]
        assert report.dropped == len(seqs) - len(kept)


def _packed(*columns: list[int]) -> bytes:
    n = len(columns[0])
    return struct.pack(f"<{4 * n}q{n}B", *(x for column in columns for x in column))


@pytest.mark.parametrize(
    ("attrs", "why", "packed"),
    [
        ({c.ATTR_COMM_HASH: "XYZ"}, "hex", True),
        ({c.ATTR_COMM_RANK: 8}, "rank", True),
        ({c.ATTR_NRANKS: -1}, "count", True),
        ({c.ATTR_SEQS: [2, 1]}, "increasing", False),
        ({c.ATTR_ENTERED: [1]}, "list of 2", False),
        ({c.ATTR_OPS: ["x" * 100, "y"]}, "op name", False),
        ({c.ATTR_INFLIGHT_SEQ: "3"}, "count", True),
        ({c.ATTR_BYTES: [1, True]}, "integer", False),
        ({c.ATTR_PACKED: b"\0" * 34}, "calls of 33 bytes", True),
        ({c.ATTR_PACKED: "text"}, "is not bytes", True),
        ({c.ATTR_PACKED: b"\0" * 33 * 65}, "at most 64", True),
        ({c.ATTR_PACKED: _packed([2, 1], [5, 6], [7, 8], [1, 1], [0, 0])}, "increasing", True),
        ({c.ATTR_PACKED: _packed([1, 2], [5, -6], [7, 8], [1, 1], [0, 0])}, "negative", True),
        ({c.ATTR_PACKED: _packed([1, 2], [5, 6], [7, 8], [1, 1], [0, 1])}, "does not list", True),
        ({c.ATTR_PACKED_OPS: ["x" * 100]}, "op names", True),
        ({c.ATTR_PACKED_OPS: "ncclAllReduce"}, "op names", True),
    ],
)
def test_a_bad_communicator_is_refused_with_a_reason_and_the_score_kept(
    attrs: dict[str, object], why: str, packed: bool
) -> None:
    push = NodePush("n1", "c1", 0.9, collectives=(comm((call(1), call(2))),))
    request = encode_health(push, T0, nccl_packed=packed)
    point = next(
        m for m in request.resource_metrics[0].scope_metrics[0].metrics if m.name == c.COMM_METRIC
    ).gauge.data_points[0]
    keep = [kv for kv in point.attributes if kv.key not in attrs]
    del point.attributes[:]
    point.attributes.extend(keep)
    from ingero.otlp.values import add_attributes

    add_attributes(point.attributes, attrs)
    decoded = decode_health(request)
    assert decoded.rejected == 1 and why in decoded.error_message, decoded.messages
    (push,) = decoded.pushes
    assert push.score == 0.9 and push.collectives == ()


def test_a_bad_clock_offset_is_refused() -> None:
    request = encode_health(NodePush("n1", "c1", 0.9, clock=c.ClockOffset(0.1, 0.01)), T0)
    metric = request.resource_metrics[0].scope_metrics[0].metrics[-1]
    del metric.gauge.data_points[0].attributes[:]
    decoded = decode_health(request)
    assert decoded.rejected == 1 and c.ATTR_CLOCK_UNCERTAINTY in decoded.error_message
    assert decoded.pushes[0].clock is None


_calls = st.lists(st.integers(1, 10_000), max_size=200, unique=True).map(
    lambda seqs: tuple(call(s) for s in sorted(seqs))
)
_int64 = st.integers(0, 2**63 - 1)
_wire_calls = st.lists(
    st.tuples(
        _int64,
        st.text(min_size=1, max_size=c.MAX_OP_CHARS),
        _int64,
        st.none() | st.integers(1, 2**63 - 1),
        _int64,
    ),
    max_size=c.MAX_CALLS,
    unique_by=lambda t: t[0],
).map(lambda items: tuple(c.CollectiveCall(*item) for item in sorted(items)))


@settings(max_examples=80, deadline=None)
@given(_wire_calls, st.booleans())
def test_the_decoder_returns_every_call_its_encoder_wrote(
    calls: tuple[c.CollectiveCall, ...], packed: bool
) -> None:
    report = comm(calls)
    out = round_trip(NodePush("n1", "c1", 0.9, collectives=(report,)), packed)
    assert out.collectives == (report,)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=c.PACKED_CALL_BYTES * 3 + 2), st.lists(st.text(max_size=3), max_size=3))
def test_any_packed_bytes_decode_to_sane_calls_or_a_reason(data: bytes, names: list[str]) -> None:
    push = NodePush("n1", "c1", 0.9, collectives=(comm((call(1),)),))
    request = encode_health(push, T0)
    point = next(
        m for m in request.resource_metrics[0].scope_metrics[0].metrics if m.name == c.COMM_METRIC
    ).gauge.data_points[0]
    for kv in point.attributes:
        if kv.key == c.ATTR_PACKED:
            kv.value.bytes_value = data
        elif kv.key == c.ATTR_PACKED_OPS:
            del kv.value.array_value.values[:]
            for name in names:
                kv.value.array_value.values.add().string_value = name
    decoded = decode_health(request)
    (out,) = decoded.pushes
    assert decoded.rejected + len(out.collectives) == 1
    for report in out.collectives:
        assert len(report.calls) == len(data) // c.PACKED_CALL_BYTES <= c.MAX_CALLS
        seqs = [x.seq for x in report.calls]
        assert seqs == sorted(set(seqs)) and all(x.op in names for x in report.calls)
        assert min((x.entered_ns for x in report.calls), default=0) >= 0


@settings(max_examples=60, deadline=None)
@given(_calls, st.integers(1, 100))
def test_sample_calls_is_bounded_ordered_and_keeps_the_last(
    calls: tuple[c.CollectiveCall, ...], limit: int
) -> None:
    picked = c.sample_calls(calls, limit)
    assert len(picked) <= limit
    assert [p.seq for p in picked] == sorted({p.seq for p in picked})
    if calls:
        assert picked[-1] == calls[-1]


@settings(max_examples=80, deadline=None)
@given(st.binary(max_size=400))
def test_decoding_any_bytes_as_a_push_never_raises_past_its_errors(data: bytes) -> None:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )

    base = encode_health(NodePush("n1", "c1", 0.9, collectives=(comm((call(1),)),)), T0)
    raw = base.SerializeToString()
    request = ExportMetricsServiceRequest()
    try:
        request.ParseFromString(raw[: len(data) % (len(raw) + 1)] + data)
    except Exception:  # not a protobuf: the receiver refuses it earlier
        return
    decode_health(request)


def test_packed_calls_survive_otlp_json() -> None:
    """OTLP/JSON carries a bytes value as base64: the packed calls decode the same."""
    from ingero.otlp.values import parse_json, to_json

    report = comm((call(1), call(2, returned=False)))
    request = encode_health(NodePush("n1", "c1", 0.9, collectives=(report,)), T0)
    decoded = decode_health(parse_json(to_json(request), ExportMetricsServiceRequest))
    assert decoded.rejected == 0, decoded.messages
    assert decoded.pushes[0].collectives == (report,)
