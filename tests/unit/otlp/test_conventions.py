"""OpenTelemetry conventions on ingero's OTLP: service.* on every resource,
semantic-convention names beside the contract's, one gauge per unit; through the codecs."""

from __future__ import annotations

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.semconv._incubating.attributes import cloud_attributes, hw_attributes
from opentelemetry.semconv.attributes import service_attributes as semconv_service

from ingero import __version__
from ingero.fleet.forwarder import Forwarder
from ingero.otlp import health, resource
from ingero.otlp.logs import decode_events
from ingero.otlp.values import any_to_python, parse_json, parse_protobuf, to_json
from ingero.schema.events import Event

T = 1_700_000_000_000_000_000
PUSH = health.NodePush(
    node_id="gpu-007",
    cluster_id="hpc",
    score=0.83,
    gpu_model="H100",
    gpu_count=8,
    provider="aws",
    rates={
        health.KERNEL_LAUNCH_RATE: 1234.0,
        health.STEP_RATE: 2.5,
        "gpu_busy_fraction": 0.75,
        "throughput_baseline": 1300.0,  # no unit of its own: only in ingero.node.rate
    },
)
SERVICE = resource.service_attributes(resource.PUSH_SERVICE, "gpu-007")


def wire(request: ExportMetricsServiceRequest) -> ExportMetricsServiceRequest:
    return parse_protobuf(request.SerializeToString(), ExportMetricsServiceRequest)


def resource_of(request: ExportMetricsServiceRequest) -> dict[str, object]:
    rm = request.resource_metrics[0]
    return {kv.key: any_to_python(kv.value) for kv in rm.resource.attributes}


def test_names_are_the_semantic_conventions() -> None:
    assert resource.SERVICE_NAME == semconv_service.SERVICE_NAME
    assert resource.SERVICE_VERSION == semconv_service.SERVICE_VERSION
    assert resource.SERVICE_INSTANCE_ID == semconv_service.SERVICE_INSTANCE_ID
    assert resource.CLOUD_PROVIDER == cloud_attributes.CLOUD_PROVIDER
    assert resource.HW_MODEL == hw_attributes.HW_MODEL


def test_health_resource_has_service_and_both_names() -> None:
    attrs = resource_of(wire(health.encode_health(PUSH, T, SERVICE)))
    assert attrs["service.name"] == "ingero-push" and attrs["service.version"] == __version__
    assert attrs["service.instance.id"] == "gpu-007"
    # old contract names kept, semantic-convention names added beside them
    assert attrs["ingero.provider"] == attrs["cloud.provider"] == "aws"
    assert attrs["ingero.gpu.model"] == attrs["hw.model"] == "H100"
    assert attrs["ingero.gpu.count"] == 8


def test_one_gauge_per_unit_beside_the_mixed_one() -> None:
    request = wire(health.encode_health(PUSH, T, SERVICE))
    metrics = {m.name: m for m in request.resource_metrics[0].scope_metrics[0].metrics}
    launches = metrics["ingero.node.kernel_launch.rate"]
    assert launches.unit == "{launch}/s" and launches.gauge.data_points[0].as_double == 1234.0
    assert metrics["ingero.node.step.rate"].unit == "{step}/s"
    assert metrics["ingero.node.gpu.busy"].unit == "1"
    assert len(metrics[health.RATE_METRIC].gauge.data_points) == 4  # the old one, unchanged
    assert not any("throughput_baseline" in name for name in metrics)
    assert health.decode_health(request).pushes == [PUSH]


def test_decoder_takes_the_per_unit_gauges_alone_and_the_semconv_names_alone() -> None:
    """A sender that writes only the new names (no ingero.node.rate, no ingero.provider /
    ingero.gpu.model) decodes to the same push."""
    request = wire(health.encode_health(PUSH, T, SERVICE))
    rm = request.resource_metrics[0]
    sm = rm.scope_metrics[0]
    keep = [m for m in sm.metrics if m.name != health.RATE_METRIC]
    del sm.metrics[:]
    sm.metrics.extend(keep)
    attrs = [
        a for a in rm.resource.attributes if a.key not in ("ingero.provider", "ingero.gpu.model")
    ]
    del rm.resource.attributes[:]
    rm.resource.attributes.extend(attrs)
    (push,) = health.decode_health(request).pushes
    assert push.provider == "aws" and push.gpu_model == "H100"
    assert push.rates == {k: v for k, v in PUSH.rates.items() if k in health.UNIT_GAUGES}
    # the same through OTLP/JSON
    again = parse_json(to_json(request), ExportMetricsServiceRequest)
    assert health.decode_health(again).pushes == [push]


class Recorder:
    """Keeps what the forwarder sends (in place of Echo's OTLP/HTTP listener)."""

    def __init__(self) -> None:
        self.sent: list[ExportLogsServiceRequest] = []

    def send(self, request: ExportLogsServiceRequest) -> None:
        self.sent.append(parse_protobuf(request.SerializeToString(), ExportLogsServiceRequest))

    def close(self) -> None:
        pass


def test_fleet_forwarder_sends_events_under_fleet_service() -> None:
    fleet = resource.service_attributes(resource.FLEET_SERVICE, "central/0.0.0.0:8080")
    recorder = Recorder()
    forwarder = Forwarder(recorder, service=fleet)
    try:
        forwarder.submit(
            [Event(type="straggler_state", node_id="n1", cluster_id="c", timestamp=1.0)]
        )
        assert forwarder.flush(30)
    finally:
        forwarder.close()
    (logs,) = recorder.sent
    attrs = {kv.key: any_to_python(kv.value) for kv in logs.resource_logs[0].resource.attributes}
    assert attrs == fleet
    assert decode_events(logs).events[0].node_id == "n1"
