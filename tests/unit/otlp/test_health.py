"""The OTLP health push codec: round trip, JSON mapping, and each kind of bad point."""

from __future__ import annotations

import math

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from ingero.otlp import health
from ingero.otlp.health import NodePush
from ingero.otlp.values import OtlpDecodeError, parse_json, parse_protobuf, to_json

FULL = NodePush(
    node_id="gpu-007",
    cluster_id="hpc",
    score=0.83,
    state="active",
    host_name="gpu-007.example",
    job_id="4242",
    rank=3,
    world_size=8,
    workload_type="training",
    dominant_signal="compute",
    signals={"throughput": 0.9, "compute": 0.7},
    rates={"kernel_launches_per_s": 1234.0},
    gpu_model="H100",
    gpu_count=8,
    provider="onprem",
    cause_class="network",
)


def roundtrip(push: NodePush) -> health.HealthDecode:
    wire = health.encode_health(push, 1_700_000_000_000_000_000).SerializeToString()
    return health.decode_health(parse_protobuf(wire, ExportMetricsServiceRequest))


def test_roundtrip_keeps_every_field() -> None:
    result = roundtrip(FULL)
    assert result.rejected == 0
    assert result.pushes == [FULL]


# What a score history point carries of a push (encode_score_history): no details.
HISTORY = NodePush(
    node_id="gpu-007",
    cluster_id="hpc",
    score=0.83,
    host_name="gpu-007.example",
    job_id="4242",
    rank=3,
    workload_type="training",
    dominant_signal="compute",
    gpu_model="H100",
    gpu_count=8,
    provider="onprem",
)


def test_batch_of_nodes_decodes_to_each_push_with_its_own_time() -> None:
    other = NodePush(node_id="gpu-008", cluster_id="hpc", score=0.4, state="idle", job_id="9")
    request = health.encode_score_history([(HISTORY, 1_000), (other, 2_000)])
    wire = parse_protobuf(request.SerializeToString(), ExportMetricsServiceRequest)
    assert health.decode_health(wire).pushes == [HISTORY, other]
    times = [
        rm.scope_metrics[0].metrics[0].gauge.data_points[0].time_unix_nano
        for rm in wire.resource_metrics
    ]
    assert times == [1_000, 2_000]


def test_a_score_history_point_is_its_push_without_the_details() -> None:
    """The history form writes a push's resource and score point as encode_health does,
    and nothing of the push's signals, rates, NCCL report or flags."""
    (only,) = health.decode_health(health.encode_score_history([(FULL, 1_000)])).pushes
    assert only == HISTORY
    whole = health.encode_health(FULL, 1_000)
    point = whole.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0]
    details = {health.ATTR_WORLD_SIZE, health.ATTR_CAUSE}
    for kv in [kv for kv in point.attributes if kv.key in details]:
        point.attributes.remove(kv)
    del whole.resource_metrics[0].scope_metrics[0].metrics[1:]
    assert health.encode_score_history([(FULL, 1_000)]) == whole


def test_the_decoder_returns_every_push_with_the_time_its_encoder_wrote() -> None:
    other = NodePush(node_id="gpu-008", cluster_id="hpc", score=0.4)
    bad = NodePush(node_id="gpu-009", cluster_id="hpc", score=0.5)
    request = health.encode_score_history([(HISTORY, 1_000), (bad, 1_500), (other, 2_000)])
    # the middle node's score is refused: the times stay with their own pushes
    request.resource_metrics[1].scope_metrics[0].metrics[0].gauge.data_points[0].as_double = 7.0
    for body, parse in (
        (request.SerializeToString(), parse_protobuf),
        (to_json(request), parse_json),
    ):
        result = health.decode_health(parse(body, ExportMetricsServiceRequest))
        assert result.times == [1_000, 2_000] and result.rejected == 1
        assert list(result.timed()) == [(HISTORY, 1_000), (other, 2_000)]
        # what it returns is what the encoder takes: the round trip is whole
        again = health.encode_score_history(result.timed()).SerializeToString()
        expected = health.encode_score_history([(HISTORY, 1_000), (other, 2_000)])
        assert again == expected.SerializeToString()


def test_minimal_push_defaults_to_active() -> None:
    result = roundtrip(NodePush(node_id="n1", cluster_id="c", score=1.0))
    assert result.pushes == [NodePush(node_id="n1", cluster_id="c", score=1.0)]


def test_json_mapping_roundtrip() -> None:
    body = to_json(health.encode_health(FULL, 5))
    assert b'"ingero.node.health_score"' in body
    result = health.decode_health(parse_json(body, ExportMetricsServiceRequest))
    assert result.pushes == [FULL]


def test_int_job_id_and_int_score_accepted() -> None:
    request = health.encode_health(NodePush(node_id="n", cluster_id="c", score=0.5), 1)
    point = request.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0]
    point.as_int = 1
    kv = point.attributes.add()
    kv.key = health.ATTR_JOB_ID
    kv.value.int_value = 77
    (push,) = health.decode_health(request).pushes
    assert push.score == 1.0 and push.job_id == "77"


@pytest.mark.parametrize("score", [math.nan, math.inf, -math.inf, -0.01, 1.5])
def test_bad_scores_rejected(score: float) -> None:
    request = health.encode_health(NodePush(node_id="n", cluster_id="c", score=0.5), 1)
    request.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0].as_double = score
    result = health.decode_health(request)
    assert result.pushes == [] and result.rejected == 1
    assert result.reasons == {health.BAD_SCORE: 1}
    assert "not in [0, 1]" in result.error_message


def test_missing_node_and_cluster_ids_rejected() -> None:
    request = ExportMetricsServiceRequest()
    for push in (
        NodePush(node_id="", cluster_id="c", score=0.5),
        NodePush(node_id="n", cluster_id="", score=0.5),
        NodePush(node_id="ok", cluster_id="c", score=0.5),
    ):
        request.resource_metrics.extend(health.encode_health(push, 1).resource_metrics)
    result = health.decode_health(request)
    assert [p.node_id for p in result.pushes] == ["ok"]
    assert result.reasons == {health.MISSING_NODE_ID: 1, health.MISSING_CLUSTER_ID: 1}


def test_a_push_says_whether_it_holds_and_an_older_agents_says_nothing() -> None:
    for held in (True, False):
        push = NodePush(node_id="n", cluster_id="c", score=0.5, held=held)
        point = health.encode_health(push, 1).resource_metrics[0].scope_metrics[0]
        attrs = {
            kv.key: kv.value.bool_value for kv in point.metrics[0].gauge.data_points[0].attributes
        }
        assert attrs[health.ATTR_HELD] is held
        assert roundtrip(push).pushes == [push]
    older = health.encode_health(NodePush(node_id="n", cluster_id="c", score=0.5), 1)
    point = older.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0]
    assert health.ATTR_HELD not in {kv.key for kv in point.attributes}
    assert health.decode_health(older).pushes[0].held is None
    point.attributes.add(key=health.ATTR_HELD).value.string_value = "yes"
    result = health.decode_health(older)
    assert result.reasons == {health.BAD_ATTRIBUTE: 1}
    assert "ingero.node.held" in result.error_message


def test_a_push_says_its_cause_class_and_an_unknown_one_is_refused() -> None:
    for cause in ("hardware", "node", "network", "job"):
        push = NodePush(node_id="n", cluster_id="c", score=0.5, cause_class=cause)
        assert roundtrip(push).pushes == [push]
    assert roundtrip(NodePush(node_id="n", cluster_id="c", score=0.5)).pushes[0].cause_class is None
    request = health.encode_health(NodePush(node_id="n", cluster_id="c", score=0.5), 1)
    point = request.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0]
    point.attributes.add(key=health.ATTR_CAUSE).value.string_value = "cosmic_rays"
    result = health.decode_health(request)
    assert result.reasons == {health.BAD_ATTRIBUTE: 1} and not result.pushes
    assert "ingero.node.cause_class 'cosmic_rays' is not one of" in result.error_message


def test_bad_state_and_rank_rejected() -> None:
    request = health.encode_health(NodePush(node_id="n", cluster_id="c", score=0.5), 1)
    attrs = request.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0].attributes
    for kv in attrs:
        if kv.key == health.ATTR_STATE:
            kv.value.string_value = "sleepy"
    assert health.decode_health(request).reasons == {health.BAD_ATTRIBUTE: 1}
    request = health.encode_health(NodePush(node_id="n", cluster_id="c", score=0.5, rank=1), 1)
    attrs = request.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0].attributes
    for kv in attrs:
        if kv.key == health.ATTR_RANK:
            kv.value.string_value = "first"
    result = health.decode_health(request)
    assert result.reasons == {health.BAD_ATTRIBUTE: 1}
    assert "ingero.rank" in result.error_message


def test_histogram_score_rejected_and_other_metrics_ignored() -> None:
    request = ExportMetricsServiceRequest()
    sm = request.resource_metrics.add().scope_metrics.add()
    sm.metrics.add(name="unrelated.metric").gauge.data_points.add(as_double=3.0)
    sm.metrics.add(name=health.SCORE_METRIC).histogram.data_points.add(count=1)
    result = health.decode_health(request)
    assert result.pushes == [] and result.reasons == {health.BAD_METRIC_TYPE: 1}


def test_non_finite_signal_rejected_but_score_kept() -> None:
    push = NodePush(node_id="n", cluster_id="c", score=0.5, signals={"cpu": math.nan, "gpu": 1.0})
    result = roundtrip(push)
    assert result.reasons == {health.BAD_ATTRIBUTE: 1}
    assert result.pushes[0].signals == {"gpu": 1.0}


def test_malformed_bodies_raise_clear_errors() -> None:
    with pytest.raises(OtlpDecodeError, match="malformed protobuf"):
        parse_protobuf(b"\xff\xff\xff\xff", ExportMetricsServiceRequest)
    with pytest.raises(OtlpDecodeError, match="malformed JSON"):
        parse_json(b"{not json", ExportMetricsServiceRequest)
    with pytest.raises(OtlpDecodeError, match="JSON object"):
        parse_json(b"[1]", ExportMetricsServiceRequest)
    with pytest.raises(OtlpDecodeError, match="invalid OTLP JSON"):
        parse_json(b'{"resourceMetrics": 3}', ExportMetricsServiceRequest)


def test_a_resource_decoded_before_is_read_from_its_bytes_and_the_cache_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(health, "RESOURCE_CACHE", 4)
    monkeypatch.setattr(health, "_resources", {})
    for i in range(10):  # the same resource each push, others between
        assert roundtrip(FULL).pushes == [FULL]
        other = NodePush(node_id=f"n{i}", cluster_id="c", score=0.5, gpu_count=i)
        assert roundtrip(other).pushes == [other]
        assert len(health._resources) <= 4
    # every field read from the resource comes back from the cache too (the service groups
    # inference replicas: lost after the first push, a replica would leave its peers)
    served = NodePush(node_id="r", cluster_id="c", score=0.5, service="llama-70b")
    for _ in range(3):
        assert roundtrip(served).pushes == [served]
    # a resource that is not valid stays refused, however often it comes, with why
    bad = NodePush(node_id="n", cluster_id="c", score=0.5, host_name="h" * 10_000)
    for _ in range(2):
        result = roundtrip(bad)
        assert result.reasons == {health.TOO_LONG: 1}
        assert health.ATTR_HOST_NAME in result.error_message
