"""Pushes over every path a node can use reach the same state and get the threshold back."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
    OTLPMetricExporter as GrpcMetricExporter,
)
from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
    OTLPMetricExporter as HttpMetricExporter,
)
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource

from ingero.otlp.health import NodePush
from ingero.otlp.logs import encode_events
from ingero.schema.events import Event
from tests.integration.fleet.helpers import (
    Fleet,
    expected_threshold,
    health_request,
    start_fleet,
    wait_for,
)

pytestmark = pytest.mark.integration

SCORES = {"n1": 0.90, "n2": 0.92, "n3": 0.88, "n4": 0.91, "n5": 0.50, "n6": 0.89}


def recorded(exporter: Any) -> list[Any]:
    """The results of the SDK exporter's exports from now on: a provider's force_flush
    reports success even when the export failed, the exporter's result does not."""
    results: list[Any] = []
    export = exporter.export

    def recording(*args: Any, **kwargs: Any) -> Any:
        results.append(export(*args, **kwargs))
        return results[-1]

    exporter.export = recording
    return results


def sdk_push(exporter: MetricExporter, node: str, score: float, cluster: str) -> None:
    """One node as the OpenTelemetry SDK would run it: resource + observable gauge."""
    resource = Resource.create(
        {
            "ingero.node.id": node,
            "ingero.cluster.id": cluster,
            "host.name": f"{node}.example",
            "ingero.gpu.count": 8,
        }
    )
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = MeterProvider(resource=resource, metric_readers=[reader])

    def observe(_options: CallbackOptions) -> list[Observation]:
        return [Observation(score, {"ingero.node.state": "active", "ingero.workload_type": "llm"})]

    provider.get_meter("ingero").create_observable_gauge(
        "ingero.node.health_score", callbacks=[observe]
    )
    results = recorded(exporter)
    try:
        provider.force_flush(30_000)
    finally:
        provider.shutdown()
    assert results and all(r is MetricExportResult.SUCCESS for r in results), results


def settled(fleet: Fleet, cluster: str, n: int, **query: str) -> dict[str, object]:
    def check() -> dict[str, object] | None:
        reply = fleet.threshold(cluster, **query)
        if reply.status != 200:
            return None
        view: dict[str, object] = reply.json()
        return view if view["active_nodes"] == n and view["quorum_met"] else None

    return wait_for(check, what=f"{n} active nodes in {cluster}")


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_official_sdk_exporters(fleet: Fleet, transport: str) -> None:
    def make() -> MetricExporter:
        if transport == "http":
            return HttpMetricExporter(endpoint=f"http://{fleet.otlp_http}/v1/metrics", timeout=30)
        return GrpcMetricExporter(endpoint=fleet.otlp_grpc, insecure=True, timeout=30)

    for node, score in SCORES.items():
        sdk_push(make(), node, score, "sdk")
    view = settled(fleet, "sdk", len(SCORES), workload_type="llm")
    assert view["group"] == "sdk/workload/llm"
    assert math.isclose(view["threshold"], expected_threshold(SCORES.values()), abs_tol=1e-12)  # type: ignore[arg-type]
    assert view["median"] == pytest.approx(0.895)
    # n5 is far below its peers: the tick classifies it a straggler.
    wait_for(
        lambda: fleet.metric("ingero_fleet_stragglers", group="sdk/workload/llm") == 1,
        what="one straggler",
    )
    assert fleet.metric("ingero_fleet_requests_total", transport=transport, signal="metrics") >= 6


def push_all(fleet: Fleet, job: str = "77") -> list[NodePush]:
    pushes = [
        NodePush(node_id=n, cluster_id="hpc", score=s, job_id=job, rank=i)
        for i, (n, s) in enumerate(SCORES.items())
    ]
    reply = fleet.push(pushes)
    assert reply.status == 200
    return pushes


@pytest.mark.parametrize("encoding", ["protobuf", "json", "gzip"])
def test_http_headers_carry_the_threshold(fleet: Fleet, encoding: str) -> None:
    pushes = push_all(fleet)
    view = settled(fleet, "hpc", len(SCORES), job_id="77")
    before = time.time()
    reply = fleet.push(pushes[:1], encoding)
    after = time.time()
    assert reply.status == 200
    assert float(reply.headers["x-ingero-threshold"]) == view["threshold"]
    # Fleet's time as it answered (same host, same clock): within the round trip.
    assert before <= float(reply.headers["x-ingero-server-time"]) <= after
    assert reply.headers["x-ingero-quorum-met"] == "true"
    assert reply.headers["x-ingero-panic"] == "false"
    expected_type = "application/json" if encoding == "json" else "application/x-protobuf"
    assert reply.headers["content-type"] == expected_type
    if encoding != "json":
        response = ExportMetricsServiceResponse.FromString(reply.body)
        assert response.partial_success.rejected_data_points == 0


def test_grpc_initial_metadata_carries_the_threshold(fleet: Fleet) -> None:
    pushes = push_all(fleet)
    view = settled(fleet, "hpc", len(SCORES), job_id="77")
    with grpc.insecure_channel(fleet.otlp_grpc) as channel:
        export = channel.unary_unary(
            "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=ExportMetricsServiceResponse.FromString,
        )
        before = time.time()
        response, call = export.with_call(
            health_request(pushes[:2]), timeout=10, compression=grpc.Compression.Gzip
        )
        after = time.time()
    metadata = dict(call.initial_metadata())
    assert float(metadata["ingero-threshold"]) == view["threshold"]
    assert before <= float(metadata["ingero-server-time"]) <= after
    assert metadata["ingero-quorum-met"] == "true"
    assert metadata["ingero-panic"] == "false"
    assert response.partial_success.rejected_data_points == 0


def test_events_as_otlp_logs_on_both_transports(fleet: Fleet) -> None:
    event = Event(
        type="straggler_state",
        node_id="n5",
        cluster_id="hpc",
        timestamp=1.7e9,
        score=0.5,
        threshold=0.8,
    )
    request = encode_events([event])
    reply = fleet.request(
        fleet.otlp_http,
        "POST",
        "/v1/logs",
        request.SerializeToString(),
        {"Content-Type": "application/x-protobuf"},
    )
    assert reply.status == 200
    assert (
        ExportLogsServiceResponse.FromString(reply.body).partial_success.rejected_log_records == 0
    )
    bad = encode_events([event])
    bad.resource_logs[0].scope_logs[0].log_records.add().body.string_value = "not an event"
    with grpc.insecure_channel(fleet.otlp_grpc) as channel:
        export = channel.unary_unary(
            "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=ExportLogsServiceResponse.FromString,
        )
        response = export(bad, timeout=10)
    assert response.partial_success.rejected_log_records == 1
    assert "not an ingero event" in response.partial_success.error_message
    # Both valid events reach the sinks (the log sink writes each with its event_id).
    wait_for(
        lambda: (
            fleet.metric("ingero_fleet_events_total", type="straggler_state", source="otlp") == 2
        ),
        what="two forwarded events",
    )
    assert fleet.log().count(f"event_id={event.event_id}") == 2
    assert fleet.metric("ingero_fleet_rejected_total", reason="bad_event") == 1


def test_ema_smoothing_matches_an_independent_computation(tmp_path: Path) -> None:
    """Default ema_alpha 0.2: after a step from scores A to B, every published threshold
    is raw_B + 0.8^m (raw_A - raw_B) for a whole number m of ticks since the step."""
    # noise_k 0: the step moves every node by 0.2, which the noise term would take for
    # the job's noise (tests/unit/fleet/test_noise.py has that term's own tests).
    fleet = start_fleet(
        tmp_path, {"push_interval": "0.5s", "threshold": {"ema_alpha": 0.2, "noise_k": 0}}
    )
    try:
        a = [0.90, 0.92, 0.88, 0.91, 0.50, 0.89]
        b = [0.70, 0.75, 0.72, 0.71, 0.74, 0.73]
        fleet.push([NodePush(node_id=f"e{i}", cluster_id="ema", score=s) for i, s in enumerate(a)])
        first = settled(fleet, "ema", 6)
        raw_a, raw_b = expected_threshold(a), expected_threshold(b)
        assert first["threshold"] == pytest.approx(raw_a, abs=1e-12)  # the EMA starts at raw
        fleet.push([NodePush(node_id=f"e{i}", cluster_id="ema", score=s) for i, s in enumerate(b)])
        seen: dict[float, float] = {}

        def three_ticks_after_step() -> bool:
            view = fleet.threshold("ema").json()
            if view["threshold"] != first["threshold"]:
                seen[view["computed_at"]] = view["threshold"]
            return len(seen) >= 3

        wait_for(three_ticks_after_step, what="three smoothed thresholds")
        steps = []
        for _, value in sorted(seen.items()):
            m = math.log((value - raw_b) / (raw_a - raw_b)) / math.log(0.8)
            assert abs(m - round(m)) < 1e-6, (value, m)
            steps.append(round(m))
        assert steps == sorted(steps) and steps[0] >= 1 and len(set(steps)) == len(steps)
    finally:
        fleet.stop()


def test_hand_written_otlp_json_as_curl_would_send(fleet: Fleet) -> None:
    body = b"""{"resourceMetrics": [{
      "resource": {"attributes": [
        {"key": "ingero.node.id", "value": {"stringValue": "curl-node"}},
        {"key": "ingero.cluster.id", "value": {"stringValue": "hpc"}},
        {"key": "ingero.gpu.count", "value": {"intValue": "8"}}]},
      "scopeMetrics": [{"scope": {"name": "manual"}, "metrics": [{
        "name": "ingero.node.health_score", "unit": "1",
        "gauge": {"dataPoints": [{
          "timeUnixNano": "1700000000000000000", "asDouble": 0.87,
          "attributes": [{"key": "slurm.job.id", "value": {"intValue": "4242"}},
                         {"key": "ingero.rank", "value": {"intValue": 3}}],
          "spanId": "00f067aa0ba902b7"}]}}]}]}]}"""
    reply = fleet.post_metrics(body, "application/json")
    assert reply.status == 200, reply.body
    assert reply.json() == {}
    assert reply.headers["x-ingero-quorum-met"] == "false"
    reply = wait_for(
        lambda: (r := fleet.threshold("hpc", "4242")).status == 200 and r,
        what="the curl node's group after a tick",
    )
    view = reply.json()
    assert view["group"] == "hpc/job/4242" and view["active_nodes"] == 1
