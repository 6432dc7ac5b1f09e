"""The OTLP exporter core: which failures retry, the waits, and what a refusal says, over
real loopback HTTP and gRPC servers."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.rpc.error_details_pb2 import RetryInfo
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)

from ingero.otlp.exporter import (
    Backoff,
    ExportError,
    GrpcExporter,
    HttpExporter,
    grpc_retry_after,
    retryable_grpc,
    retryable_http,
)
from ingero.otlp.receiver import grpc_handlers


@pytest.mark.parametrize(
    ("status", "retry"),
    [
        (400, False),
        (401, False),
        (403, False),
        (404, False),
        (405, False),
        (408, True),
        (413, False),
        (415, False),
        (429, True),
        (500, True),
        (501, True),
        (502, True),
        (503, True),
        (504, True),
    ],
)
def test_which_http_statuses_retry(status: int, retry: bool) -> None:
    assert retryable_http(status) is retry


@pytest.mark.parametrize(
    ("code", "retry_info", "retry"),
    [
        ("UNAVAILABLE", False, True),
        ("DEADLINE_EXCEEDED", False, True),
        ("ABORTED", False, True),
        ("CANCELLED", False, True),
        ("OUT_OF_RANGE", False, True),
        ("DATA_LOSS", False, True),
        ("INTERNAL", False, True),
        ("UNKNOWN", False, True),
        ("RESOURCE_EXHAUSTED", False, False),  # too large: it would never pass
        ("RESOURCE_EXHAUSTED", True, True),  # the receiver asked for a wait: it may
        ("INVALID_ARGUMENT", False, False),
        ("UNAUTHENTICATED", False, False),
        ("PERMISSION_DENIED", False, False),
        ("NOT_FOUND", False, False),
        ("UNIMPLEMENTED", False, False),
        ("FAILED_PRECONDITION", False, False),
    ],
)
def test_which_grpc_codes_retry(code: str, retry_info: bool, retry: bool) -> None:
    assert grpc.StatusCode[code].name == code
    assert retryable_grpc(code, retry_info) is retry


def test_backoff_grows_with_jitter_up_to_its_maximum_and_honours_the_receiver() -> None:
    backoff = Backoff(1.0, 8.0, random.Random(7))
    waits = [backoff.next() for _ in range(6)]
    for wait, delay in zip(waits, [1, 2, 4, 8, 8, 8], strict=True):
        assert delay / 2 <= wait <= delay + 0.01
    assert len(set(waits)) == len(waits)  # jittered, not the same figures every time
    assert backoff.next(retry_after=5.0) >= 5.0
    assert backoff.next(retry_after=3600.0) <= 8.0 + 0.01  # capped at the maximum
    backoff.reset()
    assert backoff.next() <= 1.01


def retry_details(seconds: int) -> bytes:
    status = Status(code=grpc.StatusCode.UNAVAILABLE.value[0], message="busy")
    status.details.add().Pack(RetryInfo(retry_delay=Duration(seconds=seconds, nanos=500_000_000)))
    return status.SerializeToString()


def test_grpc_retry_info_is_read_from_the_status_details() -> None:
    assert grpc_retry_after([("grpc-status-details-bin", retry_details(3))]) == 3.5
    assert grpc_retry_after([("other", "x")]) is None
    assert grpc_retry_after(None) is None
    assert grpc_retry_after([("grpc-status-details-bin", b"\xff\xff")]) is None


@pytest.fixture
def http_receiver() -> Iterator[tuple[str, dict[str, Any]]]:
    """A loopback OTLP/HTTP receiver answering what ``script`` says."""
    script: dict[str, Any] = {"status": 200, "headers": {}, "body": b""}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(script["status"])
            for name, value in script["headers"].items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(script["body"])))
            self.end_headers()
            self.wfile.write(script["body"])

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", script
    finally:
        server.shutdown()
        server.server_close()


def test_an_http_refusal_says_why_whether_to_retry_and_when(
    http_receiver: tuple[str, dict[str, Any]],
) -> None:
    url, script = http_receiver
    exporter = HttpExporter(url, None, 10.0, receiver="echo")
    assert exporter.send(ExportLogsServiceRequest()).status == 200
    script.update(
        status=503,
        headers={"Retry-After": "7", "Content-Type": "application/x-protobuf"},
        body=Status(code=14, message="store busy").SerializeToString(),
    )
    with pytest.raises(ExportError) as info:
        exporter.send(ExportLogsServiceRequest())
    assert str(info.value) == "echo answered HTTP 503: store busy"
    assert info.value.retryable and info.value.retry_after == 7.0
    script.update(status=400, headers={"Content-Type": "text/plain"}, body=b"bad event")
    with pytest.raises(ExportError) as info:
        exporter.send(ExportLogsServiceRequest())
    assert str(info.value) == "echo answered HTTP 400: bad event"
    assert not info.value.retryable and info.value.retry_after is None


def test_an_unreachable_receiver_is_retryable() -> None:
    with pytest.raises(ExportError) as info:
        HttpExporter("http://127.0.0.1:1", None, 5.0).send(ExportLogsServiceRequest())
    assert info.value.retryable and "cannot reach" in str(info.value)


@pytest.mark.parametrize(
    ("code", "details", "retry", "retry_after"),
    [
        (grpc.StatusCode.UNAVAILABLE, b"", True, None),
        (grpc.StatusCode.INVALID_ARGUMENT, b"", False, None),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, b"", False, None),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, retry_details(2), True, 2.5),
    ],
)
def test_a_grpc_refusal_says_whether_to_retry_and_when(
    code: grpc.StatusCode, details: bytes, retry: bool, retry_after: float | None
) -> None:
    def export(raw: bytes, context: grpc.ServicerContext) -> ExportLogsServiceResponse:
        if details:
            context.set_trailing_metadata([("grpc-status-details-bin", details)])
        context.abort(code, "refused")
        raise AssertionError

    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers(grpc_handlers({"logs": export}))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    exporter = GrpcExporter(f"grpc://127.0.0.1:{port}", "tok", 10.0, receiver="echo")
    try:
        with pytest.raises(ExportError) as info:
            exporter.send(ExportLogsServiceRequest())
    finally:
        exporter.close()
        server.stop(0).wait()
    assert str(info.value) == f"echo answered {code.name}: refused"
    assert info.value.retryable is retry and info.value.retry_after == retry_after
