"""Events as OTLP log records: every field survives, invalid records are rejected."""

from __future__ import annotations

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from ingero.events import Event
from ingero.otlp.logs import decode_events, encode_events
from ingero.otlp.values import parse_json, parse_protobuf, to_json

EVENT = Event(
    type="straggler_state",
    node_id="gpu-3",
    cluster_id="hpc",
    timestamp=1_700_000_123.5,
    job_id="99",
    rank=2,
    score=0.41,
    threshold=0.7,
    detection_mode="fleet",
    dominant_signal="memory",
    extra={"panic": True, "reason": "slow", "details": {"a": 1, "b": [1, 2]}},
)


def test_roundtrip_protobuf() -> None:
    request = encode_events([EVENT], {"ingero.node.id": "gpu-3"})
    record = request.resource_logs[0].scope_logs[0].log_records[0]
    assert record.body.string_value == EVENT.message()
    assert record.event_name == "ingero.straggler_state"
    decoded = decode_events(parse_protobuf(request.SerializeToString(), ExportLogsServiceRequest))
    assert decoded.rejected == 0
    assert [e.to_dict() for e in decoded.events] == [EVENT.to_dict()]


def test_roundtrip_json_with_hex_trace_id() -> None:
    body = to_json(encode_events([EVENT])).replace(
        b'"scopeLogs"', b'"unknownField": 1, "scopeLogs"'
    )
    body = body.replace(
        b'"logRecords": [{', b'"logRecords": [{"traceId": "0af7651916cd43dd8448eb211c80319c", '
    )
    decoded = decode_events(parse_json(body, ExportLogsServiceRequest))
    assert [e.event_id for e in decoded.events] == [EVENT.event_id]


def test_invalid_records_rejected_with_reason() -> None:
    request = encode_events([EVENT])
    records = request.resource_logs[0].scope_logs[0].log_records
    records.add().body.string_value = "a plain log line"
    bad = records.add()
    bad.attributes.extend(records[0].attributes)
    for kv in bad.attributes:
        if kv.key == "score":
            kv.value.string_value = "high"
    decoded = decode_events(request)
    assert len(decoded.events) == 1 and decoded.rejected == 2
    assert "missing" in decoded.error_message and "score" in decoded.error_message


def test_attributes_dict_reads_every_value_kind_like_any_to_python() -> None:
    from opentelemetry.proto.common.v1.common_pb2 import KeyValue

    from ingero.otlp.values import add_attributes, any_to_python, attributes_dict

    request = encode_events([])
    attrs = request.resource_logs[0].resource.attributes
    values = {"s": "x", "e": "", "i": -3, "f": 0.5, "t": True, "no": False, "z": 0, "b": b"\x00"}
    add_attributes(attrs, {**values, "m": {"k": [1, "a"]}, "a": [True, 2.5]})
    attrs.append(KeyValue(key="unset"))
    out = attributes_dict(attrs)
    assert out == {kv.key: any_to_python(kv.value) for kv in attrs}
    assert out == {**values, "m": {"k": [1, "a"]}, "a": [True, 2.5], "unset": None}
    assert type(out["t"]) is bool and type(out["i"]) is int
