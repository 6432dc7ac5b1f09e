"""A real ``ingero fleet`` joins the ranks of one NCCL communicator pushed by five nodes
(OTLP/HTTP; n1 and n4 over OTLP/gRPC; encode_health; n2 as an older node, its calls as
arrays, the others packed): a rank 200 ms late is named in a ``peer_lag``
event and in its push replies, a rank that stops before collective N while the others wait
inside it is named by a ``collective_hang`` within one push interval of ``nccl.hang_after``.
Rounds advance one Fleet tick at a time (its tick counter), never by sleeping a duration."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)

from ingero.otlp.collectives import ClockOffset, CollectiveCall, CommReport
from ingero.otlp.health import NodePush, encode_health
from tests.integration.fleet.helpers import Fleet, health_request, start_fleet, wait_for
from tests.integration.fleet.test_prometheus import promtool_check

pytestmark = pytest.mark.integration

HASH = "5a17c0ffee000001"
NRANKS = 5
LATE_RANK, LATE_S = 3, 0.2
STOP_RANK = 4
PERIOD_S = 0.02  # between two collectives
PER_ROUND = 20
PUSH_INTERVAL = 0.5
HANG_AFTER = 2.0
# What each node adds to its clock to read Fleet's (reported, so the join corrects it).
SKEW = {"n1": 1.5, "n2": -0.75}
OLDER_NODE = "n2"  # its rank must join the others' for the late rank to be named


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    daemon = start_fleet(
        tmp_path,
        {
            "push_interval": f"{PUSH_INTERVAL}s",
            "quorum": {"statistical_min": 3},
            "nccl": {"hang_after": f"{HANG_AFTER}s", "window": 10},
        },
    )
    try:
        yield daemon
    finally:
        daemon.stop()


@dataclass
class Job:
    """Five nodes, one rank each, of one communicator; the test plays their tracers."""

    fleet: Fleet
    seq: int = 0
    block_at: int | None = None  # ranks that reach it stay inside
    inside_since: float = 0.0

    def node_ns(self, node: str, fleet_s: float) -> int:
        return round((fleet_s - SKEW.get(node, 0.0)) * 1e9)

    def report(self, rank: int, calls: list[CollectiveCall]) -> CommReport:
        node = f"n{rank}"
        if self.block_at is None:
            entered = self.seq
            return CommReport(HASH, rank, NRANKS, entered, entered, len(calls), calls=tuple(calls))
        if rank == STOP_RANK:  # never entered block_at: returned from the one before
            return CommReport(HASH, rank, NRANKS, self.block_at - 1, self.block_at - 1)
        since = self.node_ns(node, self.inside_since)
        return CommReport(
            HASH,
            rank,
            NRANKS,
            entered_seq=self.block_at,
            returned_seq=self.block_at - 1,
            last_enter_ns=since,
            inflight_seq=self.block_at,
            inflight_op="ncclAllReduce",
            inflight_since_ns=since,
            calls=tuple(calls),
        )

    def push_round(self, collectives: int = PER_ROUND) -> dict[str, dict[str, str]]:
        """``collectives`` more all-reduces (entry times now), one push per node; the reply
        headers (HTTP) or initial metadata (gRPC) per node."""
        base = time.time()
        calls: dict[int, list[CollectiveCall]] = {r: [] for r in range(NRANKS)}
        for i in range(collectives):
            self.seq += 1
            for rank in range(NRANKS):
                node = f"n{rank}"
                enter = base + i * PERIOD_S + (LATE_S if rank == LATE_RANK else 0.0)
                calls[rank].append(
                    CollectiveCall(
                        self.seq,
                        "ncclAllReduce",
                        self.node_ns(node, enter),
                        self.node_ns(node, enter + 0.001),
                        1 << 20,
                    )
                )
        replies = {}
        for rank in range(NRANKS):
            node = f"n{rank}"
            push = NodePush(
                node_id=node,
                cluster_id="c1",
                score=0.9,
                job_id="77",
                rank=rank,
                world_size=NRANKS,
                collectives=(self.report(rank, calls[rank]),),
                clock=ClockOffset(SKEW.get(node, 0.0), 0.0005),
            )
            replies[node] = self.send(push, grpc_transport=rank in (1, 4))
        return replies

    def send(self, push: NodePush, grpc_transport: bool) -> dict[str, str]:
        if push.node_id == OLDER_NODE:  # an older fleet-push: the calls as parallel arrays
            body = encode_health(push, time.time_ns(), nccl_packed=False).SerializeToString()
            reply = self.fleet.post_metrics(body, "application/x-protobuf")
            assert reply.status == 200, reply
            return reply.headers
        if not grpc_transport:
            reply = self.fleet.push([push])
            assert reply.status == 200, reply
            return reply.headers
        with grpc.insecure_channel(self.fleet.otlp_grpc) as channel:
            export = channel.unary_unary(
                "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=ExportMetricsServiceResponse.FromString,
            )
            response, call = export.with_call(health_request([push]), timeout=10)
        assert response.partial_success.rejected_data_points == 0, response
        return {k: v for k, v in call.initial_metadata() if isinstance(v, str)}

    def next_tick(self) -> None:
        """Wait for Fleet's next tick (its own counter), so each round is one interval."""
        ticks = self.fleet.metric("ingero_fleet_tick_seconds_count")
        wait_for(
            lambda: self.fleet.metric("ingero_fleet_tick_seconds_count") > ticks,
            30,
            "the next tick",
        )


def lines(fleet: Fleet, kind: str) -> list[str]:
    return [line for line in fleet.log().splitlines() if f"ingero {kind}: " in line]


def test_late_rank_and_hung_collective(fleet: Fleet) -> None:
    job = Job(fleet)
    rounds = 0
    while not lines(fleet, "peer_lag"):
        job.push_round()
        job.next_tick()
        rounds += 1
        assert rounds <= 8, fleet.log()
    # The late rank, and only it, with its lag within 20%.
    (lag,) = lines(fleet, "peer_lag")
    assert "node n3 job 77" in lag and f"comm {HASH} rank 3/5 ncclAllReduce" in lag, lag
    p50 = float(re.search(r"lag_p50_ms=([0-9.]+)", lag).group(1))  # type: ignore[union-attr]
    assert p50 == pytest.approx(LATE_S * 1e3, rel=0.2)
    # Its push replies and the API carry it; the others' do not (HTTP header, gRPC metadata).
    replies = job.push_round()
    assert float(replies["n3"]["x-ingero-peer-lag"]) == pytest.approx(LATE_S, rel=0.2)
    assert "x-ingero-peer-lag" not in replies["n2"]
    assert "ingero-peer-lag" not in replies["n1"]
    view = fleet.threshold("c1", "77", node_id="n3").json()
    assert view["peer_lag"] == pytest.approx(LATE_S, rel=0.2)
    job.next_tick()
    # Fleet's straggler view counts it, with the reason.
    wait_for(lambda: lines(fleet, "straggler_state"), 30, "n3's straggler_state")
    (straggler,) = lines(fleet, "straggler_state")
    assert "node n3" in straggler and "(peer_lag)" in straggler
    assert fleet.metric("ingero_fleet_node_clock_offset_seconds", node_id="n1") == 1.5
    assert fleet.metric("ingero_fleet_nccl_episodes_total", type="peer_lag") == 1

    # Rank 4 stops before collective N; the others enter N and wait inside it.
    job.block_at = job.seq + 1
    job.inside_since = time.time()
    job.push_round(collectives=0)
    ticks = 0
    while not lines(fleet, "collective_hang"):
        job.next_tick()
        job.push_round(collectives=0)
        ticks += 1
        assert ticks <= 2 * HANG_AFTER / PUSH_INTERVAL + 4, fleet.log()
    (hang,) = lines(fleet, "collective_hang")
    assert f"comm {HASH} ncclAllReduce #{job.block_at}" in hang, hang
    assert 'missing_ranks=[4] missing_nodes=["n4"]' in hang and "node n4 job 77" in hang
    inside_for = float(re.search(r"inside_for_s=([0-9.]+)", hang).group(1))  # type: ignore[union-attr]
    # Detected on the tick: within one push interval of the bound (Fleet's own figures).
    assert HANG_AFTER <= inside_for < HANG_AFTER + PUSH_INTERVAL
    # About as many ticks as the bound holds intervals (a tick or two of slack for the
    # rounds the pushes took), not many more.
    assert ticks <= HANG_AFTER / PUSH_INTERVAL + 2
    job.next_tick()
    assert fleet.metric("ingero_fleet_nccl_hung_communicators") == 1
    assert fleet.metric("ingero_fleet_nccl_episodes_total", type="collective_hang") == 1
    # promtool-clean with the NCCL and clock-offset series in it.
    metrics = fleet.request(fleet.api, "GET", "/metrics").body
    assert b"ingero_fleet_node_clock_offset_seconds{" in metrics
    assert promtool_check(metrics) == ""

    # Rank 4 arrives, the job moves on: the hang ends with the same id.
    job.block_at = None
    job.push_round()
    job.next_tick()
    wait_for(lambda: len(lines(fleet, "collective_hang")) == 2, 30, "the hang's end")
    end = lines(fleet, "collective_hang")[1]
    event_id = re.search(r"event_id=(\S+)", hang).group(1)  # type: ignore[union-attr]
    assert " end " in end and f"event_id={event_id}" in end and "(moved_on)" in end
    assert 'missing_nodes=["n4"]' in end
