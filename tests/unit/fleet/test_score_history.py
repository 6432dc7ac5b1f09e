"""Fleet's downsampled score history: the state's snapshot and the sampler (ManualClock)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from ingero.echo.decoding import metrics_to_scores
from ingero.fleet.config import FleetConfig
from ingero.fleet.score_history import ScoreHistory, ScoreSample
from ingero.fleet.state import FleetState, NodeScore
from ingero.otlp.health import NodePush, encode_health, encode_score_history
from ingero.runtime.clock import ManualClock
from ingero.runtime.config import load_config
from ingero.runtime.errors import ConfigError


def state(ttl_multiplier: float = 5) -> tuple[FleetState, ManualClock]:
    clock = ManualClock()
    return FleetState(FleetConfig(ttl_multiplier=ttl_multiplier), clock), clock


def test_snapshot_holds_active_and_idle_nodes_with_their_group_and_hardware() -> None:
    fleet, _ = state()
    fleet.ingest(
        NodePush(
            "n1",
            "A",
            0.9,
            job_id="7",
            rank=3,
            dominant_signal="compute",
            host_name="gpu01",
            gpu_model="H100",
            gpu_count=8,
            provider="onprem",
        )
    )
    fleet.ingest(NodePush("n2", "A", 0.5, state="idle", workload_type="inference"))
    fleet.ingest(NodePush("n3", "A", 0.7, state="calibrating"))
    fleet.ingest(NodePush("n4", "B", 0.6, state="stale"))
    rows = {r.node_id: r for r in fleet.scores_snapshot()}
    assert sorted(rows) == ["n1", "n2"]
    n1, n2 = rows["n1"], rows["n2"]
    assert (n1.cluster_id, n1.group, n1.job_id, n1.rank, n1.score, n1.state) == (
        "A",
        "A/job/7",
        "7",
        3,
        0.9,
        "active",
    )
    assert (n1.dominant_signal, n1.host_name, n1.gpu_model, n1.gpu_count, n1.provider) == (
        "compute",
        "gpu01",
        "H100",
        8,
        "onprem",
    )
    assert (n2.state, n2.group, n2.workload_type, n2.job_id, n2.gpu_model) == (
        "idle",
        "A/workload/inference",
        "inference",
        None,
        None,
    )


def test_a_later_push_replaces_the_snapshot_row_and_an_expired_slot_keeps_nothing() -> None:
    fleet, clock = state(ttl_multiplier=1)
    fleet.ingest(NodePush("old", "A", 0.4, gpu_model="A100", host_name="h-old"))
    clock.advance(10)  # past the 5 s TTL
    fleet.tick()
    fleet.ingest(NodePush("new", "A", 0.8))  # takes the freed slot
    fleet.ingest(NodePush("new", "A", 0.85, state="idle"))
    [row] = fleet.scores_snapshot()
    assert (row.node_id, row.score, row.state, row.gpu_model, row.host_name) == (
        "new",
        0.85,
        "idle",
        None,
        None,
    )
    assert row.seen == clock.monotonic()


def node(node_id: str, seen: float, score: float = 0.9) -> NodeScore:
    return NodeScore(
        node_id, "A", "A/job/7", "7", None, 0, score, "active", None, seen, None, "H100", 8, None
    )


def test_first_sample_at_once_then_one_per_interval() -> None:
    clock = ManualClock()
    history = ScoreHistory(30, clock)
    assert history.due()
    first = history.take([node("a", 0.0), node("b", 0.0)])
    assert [s.node.node_id for s in first] == ["a", "b"]
    assert {s.time_unix_nano for s in first} == {int(clock.now() * 1e9)}
    clock.advance(29.9)
    assert not history.due()
    clock.advance(0.1)
    assert history.due()
    second = history.take([node("a", 25.0, 0.3), node("b", 29.0)])
    assert [(s.node.node_id, s.node.score) for s in second] == [("a", 0.3), ("b", 0.9)]
    assert second[0].time_unix_nano == int(clock.now() * 1e9)


def test_a_node_silent_since_the_previous_sample_is_not_repeated() -> None:
    clock = ManualClock()
    history = ScoreHistory(10, clock)
    history.take([node("a", 0.0), node("b", 0.0)])
    clock.advance(10)
    # b last pushed before the previous sample: its old score would be a made-up point
    assert [s.node.node_id for s in history.take([node("a", 5.0), node("b", 0.0)])] == ["a"]
    clock.advance(10)
    assert history.take([node("a", 10.0), node("b", 10.0)]) == []  # pushed at the sample
    clock.advance(10)
    assert len(history.take([node("a", 25.0), node("b", 21.0)])) == 2


def test_after_a_stall_the_schedule_restarts_instead_of_catching_up() -> None:
    clock = ManualClock()
    history = ScoreHistory(10, clock)
    history.take([])
    clock.advance(35)  # three intervals missed
    assert history.due()
    history.take([])
    assert not history.due()  # not three back-to-back samples
    clock.advance(9.9)
    assert not history.due()
    clock.advance(0.1)
    assert history.due()


def test_ticks_sample_on_the_interval_not_on_every_tick() -> None:
    clock = ManualClock()
    history = ScoreHistory(30, clock)
    taken = 0
    for _ in range(60):  # 5 minutes of 5 s ticks
        if history.due():
            taken += 1
            history.take([])
        clock.advance(5)
    assert taken == 10


@pytest.mark.parametrize("interval", [0, -1])
def test_a_non_positive_interval_is_refused(interval: float) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        ScoreHistory(interval, ManualClock())


def test_samples_encode_as_the_health_pushes_echo_stores() -> None:
    clock = ManualClock()
    history = ScoreHistory(30, clock)
    nodes = [node(f"n{i}", 0.0, 0.5 + i / 100) for i in range(5)]
    request = encode_score_history(history.take(nodes))
    assert len(request.resource_metrics) == 5  # one request, many nodes
    points = metrics_to_scores(request, max_points=100, now=0.0)
    assert [(p.node_id, p.score, p.ts, p.gpu_model, p.job_id) for p in points] == [
        (f"n{i}", 0.5 + i / 100, clock.now(), "H100", "7") for i in range(5)
    ]


def test_the_interval_key_defaults_to_30s_and_refuses_bad_values_by_name() -> None:
    assert load_config(FleetConfig, "fleet").echo.score_history_interval == 30.0
    off = {"echo": {"score_history_interval": 0}}
    assert load_config(FleetConfig, "fleet", None, off).echo.score_history_interval == 0.0
    for bad in ("-1s", "soon", True):
        with pytest.raises(ConfigError, match=r"echo\.score_history_interval"):
            load_config(FleetConfig, "fleet", None, {"echo": {"score_history_interval": bad}})


def as_push(node: NodeScore) -> NodePush:
    """A stored score as the health push Fleet once rebuilt from it to forward it: the
    round trip encode_score_history cut, kept here as the reference of its bytes."""
    return NodePush(
        node_id=node.node_id,
        cluster_id=node.cluster_id,
        score=node.score,
        state=node.state,
        host_name=node.host_name,
        job_id=node.job_id,
        rank=node.rank,
        workload_type=node.workload_type,
        dominant_signal=node.dominant_signal,
        gpu_model=node.gpu_model,
        gpu_count=node.gpu_count,
        provider=node.provider,
    )


IDS = st.text(min_size=1, max_size=12)
STORED = st.builds(
    NodeScore,
    node_id=IDS,
    cluster_id=IDS,
    group=IDS,
    job_id=st.none() | IDS,
    workload_type=st.none() | IDS,
    rank=st.none() | st.integers(-(2**31), 2**31),
    score=st.floats(0.0, 1.0),
    state=st.sampled_from(["active", "idle"]),
    dominant_signal=st.none() | IDS,
    seen=st.floats(0.0, 1e6),
    host_name=st.none() | IDS,
    gpu_model=st.none() | IDS,
    gpu_count=st.none() | st.integers(0, 64),
    provider=st.none() | IDS,
)


@given(
    samples=st.lists(st.tuples(STORED, st.integers(0, 2**63 - 1)), max_size=8),
    service=st.none() | st.just({"service.name": "ingero-fleet", "service.instance.id": "f1"}),
)
def test_score_history_encodes_the_stored_scores_as_the_pushes_rebuilt_from_them(
    samples: list[tuple[NodeScore, int]], service: dict[str, object] | None
) -> None:
    """Byte for byte what Fleet sent when it turned each stored score back into a push and
    encoded that push: Echo, and any collector between, sees the same requests."""
    rebuilt = ExportMetricsServiceRequest()
    for node, time_unix_nano in samples:
        one = encode_health(as_push(node), time_unix_nano, service)
        rebuilt.resource_metrics.extend(one.resource_metrics)
    direct = encode_score_history([ScoreSample(n, t) for n, t in samples], service)
    assert direct.SerializeToString() == rebuilt.SerializeToString()
