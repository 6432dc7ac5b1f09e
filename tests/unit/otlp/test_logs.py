"""Events as OTLP log records: every field survives, invalid records are rejected."""

from __future__ import annotations

import math

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from ingero.otlp.logs import decode_events, encode_events
from ingero.otlp.values import (
    add_attributes,
    any_to_python,
    attributes_dict,
    parse_json,
    parse_protobuf,
    set_any,
    to_json,
)
from ingero.schema.events import Event

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
    request = encode_events([])
    attrs = request.resource_logs[0].resource.attributes
    values = {"s": "x", "e": "", "i": -3, "f": 0.5, "t": True, "no": False, "z": 0, "b": b"\x00"}
    add_attributes(attrs, {**values, "m": {"k": [1, "a"]}, "a": [True, 2.5]})
    attrs.append(KeyValue(key="unset"))
    out = attributes_dict(attrs)
    assert out == {kv.key: any_to_python(kv.value) for kv in attrs}
    assert out == {**values, "m": {"k": [1, "a"]}, "a": [True, 2.5], "unset": None}
    assert type(out["t"]) is bool and type(out["i"]) is int


UNSET = AnyValue()  # an attribute whose value has no oneof member set


def _value(item: object) -> AnyValue:
    """``item`` as the AnyValue kind its Python type maps to (set_any), or UNSET as is."""
    if isinstance(item, AnyValue):
        return item
    value = AnyValue()
    set_any(value, item)
    return value


# attributes_dict reads non-empty strings, non-zero doubles and non-zero ints without a oneof
# lookup; these are the values next to those shortcuts (zeros, empties, the other kinds).
@pytest.mark.parametrize(
    "item",
    [
        "x",
        "",
        0.5,
        0.0,
        -0.0,
        float("inf"),
        7,
        -3,
        0,
        True,
        False,
        b"\x00",
        b"",
        UNSET,
        [1, "a", 0.0],
        [],
        {"k": [True, 2.5], "z": 0},
        {},
    ],
)
def test_attributes_dict_keeps_each_kind_and_type(item: object) -> None:
    value = _value(item)
    expected = None if item is UNSET else item
    out = attributes_dict([KeyValue(key="k", value=value)])
    assert out == {"k": any_to_python(value)} == {"k": expected}
    assert type(out["k"]) is type(expected)
    if isinstance(expected, float):
        assert math.copysign(1.0, out["k"]) == math.copysign(1.0, expected)


def test_attributes_dict_reads_a_nan_double_as_nan() -> None:
    out = attributes_dict([KeyValue(key="k", value=_value(float("nan")))])
    assert type(out["k"]) is float and math.isnan(out["k"])


UUID = "6f3c2a1e-9b8d-4c7a-8e5f-0a1b2c3d4e51"
VALID: dict[str, object] = {
    "type": "straggler_state",
    "node_id": "n1",
    "cluster_id": "c1",
    "timestamp": 1_700_000_000.5,
    "event_id": UUID,
}


# Each row changes or adds attributes on a valid record; the decoder must give exactly what
# Event.from_dict gives on the general any_to_python reading: the same event or the same error.
@pytest.mark.parametrize(
    ("attributes", "error"),
    [
        ({}, None),
        ({"score": 0.0, "threshold": 0.8}, None),
        ({"timestamp": 5}, None),
        ({"timestamp": 0}, None),
        ({"timestamp": 0.0}, None),
        ({"rank": 0}, None),
        ({"rank": 3}, None),
        ({"job_id": 42}, None),
        ({"job_id": ""}, None),
        ({"panic": False, "ok": True, "repeat": 0, "n": 2, "f": 0.0}, None),
        ({"reason": "", "gone": UNSET}, None),
        ({"lags": {"n2": 0.5}, "ranks": [0, 1], "empty": []}, None),
        ({"event_id": UUID.upper()}, None),
        ({"event_id": "{" + UUID + "}"}, None),
        ({"event_id": "urn:uuid:" + UUID}, None),
        ({"event_id": UUID.replace("-", "")}, None),
        ({"type": "group_degraded", "node_id": ""}, None),
        ({"event_id": "x"}, "event_id must be a UUID"),
        ({"event_id": 1}, "event_id must be a string"),
        ({"node_id": ""}, "needs a node_id"),
        ({"node_id": 5}, "node_id must be a string"),
        ({"cluster_id": UNSET}, "cluster_id must be a string"),
        ({"type": "nope"}, "unknown event type"),
        ({"timestamp": float("nan")}, "timestamp must be a finite number"),
        ({"timestamp": float("inf")}, "timestamp must be a finite number"),
        ({"timestamp": True}, "timestamp must be a finite number"),
        ({"timestamp": "1"}, "timestamp must be a finite number"),
        ({"timestamp": UNSET}, "timestamp must be a finite number"),
        ({"score": float("-inf")}, "score must be a finite number"),
        ({"threshold": float("nan")}, "threshold must be a finite number"),
        ({"rank": False}, "rank must be an integer"),
        ({"rank": 2.0}, "rank must be an integer"),
        ({"blob": b"\x00"}, "finite JSON"),
        ({"lags": {"n2": float("nan")}}, "finite JSON"),
    ],
)
def test_decode_matches_the_general_reading(
    attributes: dict[str, object], error: str | None
) -> None:
    request = ExportLogsServiceRequest()
    record = request.resource_logs.add().scope_logs.add().log_records.add()
    for key, item in {**VALID, **attributes}.items():
        record.attributes.add(key=key, value=_value(item))
    general = {kv.key: any_to_python(kv.value) for kv in record.attributes}
    decoded = decode_events(request)
    if error is None:
        assert decoded.rejected == 0
        assert decoded.events == [Event.from_dict(general)]
        [event] = decoded.events
        assert type(event.timestamp) is float
        assert {k: type(v) for k, v in event.extra.items()} == {
            k: type(general[k]) for k in event.extra
        }
    else:
        with pytest.raises(ValueError, match=error):
            Event.from_dict(general)
        assert decoded.events == [] and decoded.rejected == 1
        assert error in decoded.error_message
