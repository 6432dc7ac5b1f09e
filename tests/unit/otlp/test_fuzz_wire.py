"""Fuzzing of everything that reads bytes from the network: the OTLP decoders, Echo's body
decoding and Fleet's HTTP head parser and connection protocol.

Any input must give a result or the documented error type (OtlpDecodeError, RequestError,
BadHead), never another exception; what a decoder accepts is within the limits of
``ingero.otlp.limits``. Bounded in time: a few hundred examples per property, no deadline
(a slow shared CI core must not fail a property that holds).
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from ingero.echo.decoding import Decoded, decode_body
from ingero.fleet.httpserver import (
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    BadHead,
    HttpRequest,
    HttpResponse,
    HttpServer,
    _Connection,
    _parse_head,
)
from ingero.otlp import health
from ingero.otlp.health import NODE_STATES, NodePush, decode_health, encode_health
from ingero.otlp.limits import MAX_EVENT_BYTES, MAX_ID_CHARS
from ingero.otlp.logs import decode_events, encode_events
from ingero.otlp.receiver import RequestError
from ingero.otlp.transport import JSON, PROTOBUF, Signal
from ingero.otlp.values import OtlpDecodeError, add_attributes, parse_json, parse_protobuf, to_json
from ingero.schema.events import EVENT_TYPES, Event

FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
CLASSES: tuple[type[Message], ...] = (ExportMetricsServiceRequest, ExportLogsServiceRequest)

# ---- strategies ---------------------------------------------------------------------------

# Strings around the id limit are the interesting ones, beside arbitrary text.
texts = st.one_of(
    st.text(max_size=12),
    st.integers(MAX_ID_CHARS - 1, MAX_ID_CHARS + 2).map(lambda n: "n" * n),
    st.sampled_from(["active", "idle", "stale", "calibrating", "42", "-7", "--5", "²", "1e3"]),
)
scalars = st.one_of(
    texts,
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.binary(max_size=8),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
HEALTH_KEYS = [
    health.ATTR_NODE_ID,
    health.ATTR_CLUSTER_ID,
    health.ATTR_HOST_NAME,
    health.ATTR_GPU_MODEL,
    health.ATTR_GPU_COUNT,
    health.ATTR_PROVIDER,
    health.ATTR_STATE,
    health.ATTR_WORKLOAD,
    health.ATTR_JOB_ID,
    health.ATTR_RANK,
    health.ATTR_WORLD_SIZE,
    health.ATTR_DOMINANT,
    health.ATTR_SIGNAL,
    health.ATTR_RATE,
]
EVENT_KEYS = [
    "type",
    "node_id",
    "cluster_id",
    "timestamp",
    "event_id",
    "job_id",
    "rank",
    "score",
    "threshold",
    "detection_mode",
    "dominant_signal",
    "reason",
    "panic",
]


def attributes(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(
        st.one_of(st.sampled_from(keys), st.text(max_size=6)), values, max_size=8
    )


ids = st.one_of(
    st.text(min_size=1, max_size=12),
    st.integers(MAX_ID_CHARS - 1, MAX_ID_CHARS + 2).map(lambda n: "n" * n),
)
maybe_ids = st.none() | ids
maybe_ints = st.none() | st.integers(-(2**63), 2**63 - 1)

EVENT_FIELDS = {f.name for f in dataclasses.fields(Event)}

# Well-formed pushes and events (ids around the limit): most reach the decoders' last checks.
pushes = st.builds(
    NodePush,
    node_id=ids,
    cluster_id=ids,
    score=st.floats(0.0, 1.0),
    state=st.sampled_from(sorted(NODE_STATES)),
    host_name=maybe_ids,
    job_id=maybe_ids,
    rank=maybe_ints,
    world_size=maybe_ints,
    workload_type=maybe_ids,
    dominant_signal=maybe_ids,
    signals=st.dictionaries(ids, st.floats(), max_size=2),
    rates=st.dictionaries(ids, st.floats(), max_size=2),
    gpu_model=maybe_ids,
    gpu_count=maybe_ints,
    provider=maybe_ids,
)
events = st.builds(
    Event,
    type=st.sampled_from(sorted(EVENT_TYPES)),
    node_id=ids,
    cluster_id=ids,
    timestamp=st.floats(0, 2e9),
    event_id=st.uuids().map(str),
    job_id=maybe_ids,
    rank=maybe_ints,
    score=st.none() | st.floats(0, 1),
    detection_mode=maybe_ids,
    dominant_signal=maybe_ids,
    extra=st.dictionaries(
        ids.filter(lambda k: k not in EVENT_FIELDS),
        st.none() | st.booleans() | st.integers(0, 9) | st.text(max_size=8),
        max_size=3,
    ),
)


@st.composite
def random_metrics_requests(draw: st.DrawFn) -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    for _ in range(draw(st.integers(0, 3))):
        rm = request.resource_metrics.add()
        add_attributes(rm.resource.attributes, draw(attributes(HEALTH_KEYS)))
        sm = rm.scope_metrics.add()
        for _ in range(draw(st.integers(0, 3))):
            metric = sm.metrics.add()
            metric.name = draw(
                st.sampled_from(
                    [health.SCORE_METRIC, health.SIGNAL_METRIC, health.RATE_METRIC, "other"]
                )
            )
            kind = draw(st.sampled_from(["gauge", "sum", "histogram", "none"]))
            if kind == "histogram":
                metric.histogram.data_points.add().count = 1
            elif kind != "none":
                points = getattr(metric, kind).data_points
                for _ in range(draw(st.integers(0, 3))):
                    point = points.add()
                    if draw(st.booleans()):
                        point.as_double = draw(st.floats(allow_nan=True, allow_infinity=True))
                    else:
                        point.as_int = draw(st.integers(-(2**63), 2**63 - 1))
                    point.time_unix_nano = draw(st.integers(0, 2**64 - 1))
                    add_attributes(point.attributes, draw(attributes(HEALTH_KEYS)))
    return request


def health_request(nodes: list[NodePush]) -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    for push in nodes:
        request.resource_metrics.extend(encode_health(push, 1).resource_metrics)
    return request


metrics_requests = st.one_of(
    st.lists(pushes, max_size=3).map(health_request), random_metrics_requests()
)


@st.composite
def random_logs_requests(draw: st.DrawFn) -> ExportLogsServiceRequest:
    request = ExportLogsServiceRequest()
    sl = request.resource_logs.add().scope_logs.add()
    for _ in range(draw(st.integers(0, 4))):
        record = sl.log_records.add()
        fields = draw(attributes(EVENT_KEYS))
        if draw(st.booleans()):  # mostly-valid events reach the deeper checks
            fields = {
                "type": "straggler_state",
                "node_id": "n1",
                "cluster_id": "c",
                "timestamp": 1.5,
                **fields,
            }
        add_attributes(record.attributes, fields)
        if draw(st.booleans()):
            record.body.string_value = draw(st.text(max_size=20))
        else:
            record.body.string_value = "b" * draw(st.sampled_from([0, MAX_EVENT_BYTES]))
    return request


logs_requests = st.one_of(st.lists(events, max_size=3).map(encode_events), random_logs_requests())


def mutated(body: bytes, edits: list[tuple[int, int]]) -> bytes:
    """``body`` with bytes overwritten or cut at the drawn positions."""
    data = bytearray(body)
    for position, byte in edits:
        if not data:
            break
        i = position % len(data)
        if byte < 256:
            data[i] = byte
        else:
            del data[i:]
    return bytes(data)


edits = st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 300)), max_size=4)

# ---- OTLP decoders -----------------------------------------------------------------------


def decode_all(message: Message) -> None:
    """Run every decoder that takes ``message``; check what they accept."""
    if isinstance(message, ExportMetricsServiceRequest):
        for details in (True, False):
            result = decode_health(message, details=details)
            assert result.rejected == sum(result.reasons.values())
            for push in result.pushes:
                assert 0.0 <= push.score <= 1.0
                for text in (
                    push.node_id,
                    push.cluster_id,
                    push.job_id,
                    push.host_name,
                    push.gpu_model,
                    push.provider,
                    push.workload_type,
                    push.dominant_signal,
                    *push.signals,
                    *push.rates,
                ):
                    assert text is None or len(text) <= MAX_ID_CHARS
    else:
        assert isinstance(message, ExportLogsServiceRequest)
        logs = decode_events(message)
        records = sum(len(sl.log_records) for rl in message.resource_logs for sl in rl.scope_logs)
        assert len(logs.events) + logs.rejected == records
        assert logs.rejected == sum(logs.reasons.values())
        for event in logs.events:
            assert len(event.node_id) <= MAX_ID_CHARS and len(event.cluster_id) <= MAX_ID_CHARS
            assert all(len(key) <= MAX_ID_CHARS for key in event.extra)


def parses_or_refuses(body: bytes, media: str, cls: type[Message]) -> None:
    try:
        message = parse_protobuf(body, cls) if media == PROTOBUF else parse_json(body, cls)
    except OtlpDecodeError:
        return
    decode_all(message)


@FUZZ
@given(st.binary(max_size=512), st.sampled_from(CLASSES), st.sampled_from([PROTOBUF, JSON]))
def test_any_bytes_parse_or_are_refused(body: bytes, cls: type[Message], media: str) -> None:
    parses_or_refuses(body, media, cls)


@FUZZ
@given(st.one_of(metrics_requests, logs_requests), edits, st.sampled_from([PROTOBUF, JSON]))
def test_requests_and_their_mutations(
    request: Message, changes: list[tuple[int, int]], media: str
) -> None:
    decode_all(request)
    body = request.SerializeToString() if media == PROTOBUF else to_json(request)
    parses_or_refuses(mutated(body, changes), media, type(request))


json_documents = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False) | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "resourceLogs",
                    "resourceMetrics",
                    "scopeLogs",
                    "logRecords",
                    "attributes",
                    "key",
                    "value",
                    "stringValue",
                    "kvlistValue",
                    "values",
                    "traceId",
                    "spanId",
                    "timeUnixNano",
                    "asDouble",
                ]
            )
            | st.text(max_size=4),
            inner,
            max_size=4,
        )
    ),
    max_leaves=20,
)


@FUZZ
@given(
    json_documents,
    st.integers(0, 80) | st.sampled_from([1_000, 100_000]),
    st.sampled_from(CLASSES),
)
def test_json_documents_of_any_shape_and_depth(
    document: Any, depth: int, cls: type[Message]
) -> None:
    # Nested as attribute maps inside one another, written out directly (json.dumps itself
    # would stop at the recursion limit).
    inner = json.dumps({"resourceLogs": document}).encode()
    body = b'{"kvlistValue":{"values":[{"key":"k","value":' * depth + inner + b"}]}}" * depth
    parses_or_refuses(body, JSON, cls)


@FUZZ
@given(
    st.one_of(
        st.binary(max_size=256),
        metrics_requests.map(lambda r: r.SerializeToString()),
        logs_requests.map(lambda r: r.SerializeToString()),
        logs_requests.map(to_json),
    ),
    st.sampled_from([PROTOBUF, JSON]),
    st.sampled_from(["logs", "metrics"]),
    st.integers(1, 3),
)
def test_echo_decode_body(body: bytes, media: str, kind: Signal, max_records: int) -> None:
    try:
        decoded = decode_body(body, media, kind, max_records, 1000.0)
    except RequestError:
        return
    assert isinstance(decoded, Decoded)
    assert len(decoded.rows) + len(decoded.scores) <= max_records
    for row in decoded.rows:
        assert all(len(text) <= MAX_ID_CHARS for text in row[:5] if text is not None)
        assert math.isfinite(row[10])
    for point in decoded.scores:
        assert len(point.node_id) <= MAX_ID_CHARS and len(point.cluster_id) <= MAX_ID_CHARS


# ---- Fleet's HTTP head parser and connection --------------------------------------------

header_lines = st.lists(
    st.one_of(
        st.text(st.characters(max_codepoint=255), max_size=30),
        st.sampled_from(
            [
                "Content-Length: 5",
                "Content-Length: -1",
                "Connection: close",
                "Transfer-Encoding: chunked",
                "Expect: 100-continue",
                "X: y",
                " Bad: space",
                ":",
                "Content-Length: 99999999999999999999",
            ]
        ),
    ),
    max_size=120,
)


@FUZZ
@given(
    st.one_of(
        st.binary(max_size=512),
        st.tuples(
            st.sampled_from(["GET / HTTP/1.1", "POST /v1/metrics HTTP/1.0", "GET /", "A B C"]),
            header_lines,
        ).map(lambda t: "\r\n".join([t[0], *t[1]]).encode("latin-1")),
    )
)
def test_parse_head_gives_a_request_or_bad_head(raw: bytes) -> None:
    try:
        request, length, keep_alive = _parse_head(raw)
    except BadHead as exc:
        assert exc.status in (400, 411, 431, 505)
        return
    assert isinstance(request, HttpRequest) and length >= 0 and isinstance(keep_alive, bool)


class _Transport:
    """What _Connection uses of an asyncio transport: it records what is written."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: object = None) -> object:
        # The peer address (for rate limits and the audit log), as a TCP transport has it.
        return ("127.0.0.1", 40000) if name == "peername" else default


def _gate(request: HttpRequest, length: int) -> HttpResponse | None:
    # No head over the limits reaches the application, however it arrived.
    assert len(request.headers) <= MAX_HEADERS
    size = len(request.path) + len(request.query)
    assert size + sum(len(k) + len(v) for k, v in request.headers.items()) <= MAX_HEAD_BYTES
    return HttpResponse(413, b"big\n") if length > 100 else None


_SERVER = HttpServer(
    "fuzz", "127.0.0.1", 0, lambda r: HttpResponse(200, b"ok\n"), _gate, head_timeout=10.0
)
requests_bytes = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(
        [
            b"POST /v1/metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
            b"GET / HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.0\r\n\r\n",
            b"\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 500\r\n\r\n",
            b"X" * (MAX_HEAD_BYTES + 8),
            b"GET / HTTP/1.1\r\nX: " + b"a" * (MAX_HEAD_BYTES + 100) + b"\r\n\r\n",
            b"GET / HTTP/1.1\r\n" + b"".join(b"H%d: v\r\n" % i for i in range(150)) + b"\r\n",
        ]
    ),
)


@FUZZ
@given(st.lists(requests_bytes, max_size=6), st.lists(st.integers(1, 70_000), max_size=6))
def test_connection_answers_any_byte_stream(pieces: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(pieces)
    transport = _Transport()
    conn = _Connection(_SERVER)
    conn.connection_made(transport)  # type: ignore[arg-type]
    try:
        start = 0
        for cut in [*cuts, len(stream)]:
            if transport.closed or start >= len(stream):
                break
            conn.data_received(stream[start : start + cut])
            start += cut
        answers = bytes(transport.written)
        if answers:
            assert answers.startswith(b"HTTP/1.1 ")
        # Every answer is one of the statuses the server documents.
        for line in answers.split(b"\r\n"):
            if line.startswith(b"HTTP/1.1 "):
                assert line.split(b" ")[1] in (
                    b"100",
                    b"200",
                    b"400",
                    b"411",
                    b"413",
                    b"431",
                    b"505",
                )
    finally:
        conn.connection_lost(None)
