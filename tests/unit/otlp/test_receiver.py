"""The OTLP receiver core: refusals, the status table and the answers' shapes."""

from __future__ import annotations

import json
import pickle

import grpc
import pytest
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)

from ingero.otlp.receiver import (
    RequestError,
    decode_request,
    error_reply,
    export_response,
    grpc_code,
    reply_media,
    success_reply,
)
from ingero.otlp.transport import JSON, PROTOBUF


def test_a_refusal_crosses_a_process_whole() -> None:
    error = pickle.loads(pickle.dumps(RequestError(413, "too_many_records", "too many")))
    assert (error.status, error.reason, str(error)) == (413, "too_many_records", "too many")


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, grpc.StatusCode.INVALID_ARGUMENT),
        (401, grpc.StatusCode.UNAUTHENTICATED),
        (403, grpc.StatusCode.PERMISSION_DENIED),
        (404, grpc.StatusCode.NOT_FOUND),
        (413, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (415, grpc.StatusCode.INVALID_ARGUMENT),
        (503, grpc.StatusCode.UNAVAILABLE),
        (500, grpc.StatusCode.UNKNOWN),
    ],
)
def test_one_table_from_http_status_to_grpc_code(status: int, code: grpc.StatusCode) -> None:
    assert grpc_code(status) == code
    assert Status.FromString(error_reply(status, "m", PROTOBUF).body).code == code.value[0]


def test_a_refusal_in_each_encoding() -> None:
    reply = error_reply(400, "malformed JSON: x", JSON)
    assert (reply.status, reply.content_type) == (400, JSON)
    assert json.loads(reply.body) == {
        "code": 3,
        "message": "malformed JSON: x",
        "error": "malformed JSON: x",
        "status": 400,
    }
    reply = error_reply(401, "no token", PROTOBUF, realm="r")
    assert Status.FromString(reply.body) == Status(code=16, message="no token")
    assert reply.headers == [("WWW-Authenticate", 'Bearer realm="r"')]
    assert reply_media("Application/JSON; charset=utf-8") == JSON
    assert reply_media("text/plain") == reply_media(None) == PROTOBUF


def test_success_and_partial_success() -> None:
    assert success_reply(export_response("logs"), JSON).body == b"{}"
    assert success_reply(export_response("metrics"), PROTOBUF).body == b""
    partial = success_reply(export_response("metrics", 2, "bad score"), PROTOBUF)
    response = ExportMetricsServiceResponse.FromString(partial.body)
    assert response.partial_success.rejected_data_points == 2
    assert response.partial_success.error_message == "bad score"


def test_decode_request_refuses_by_reason() -> None:
    body = ExportLogsServiceRequest().SerializeToString()
    assert decode_request(body, PROTOBUF, None, 10, ExportLogsServiceRequest) == (
        ExportLogsServiceRequest()
    )
    for content_type, encoding, data, reason in [
        ("text/plain", None, body, "unsupported_media_type"),
        (PROTOBUF, "br", body, "unsupported_encoding"),
        (PROTOBUF, "gzip", b"not gzip", "malformed_gzip"),
        (JSON, None, b"[1]", "malformed"),
    ]:
        with pytest.raises(RequestError) as info:
            decode_request(data, content_type, encoding, 10, ExportLogsServiceRequest)
        assert info.value.reason == reason
