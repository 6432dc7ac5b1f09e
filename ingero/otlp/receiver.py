"""The OTLP receiver core Fleet and Echo share: what a request may be and how it is answered.

Both daemons keep their own server (Fleet a hand-written HTTP/1.1 loop, Echo Starlette and
worker processes) and their own handling of what a request holds (Fleet's score map and
partial success, Echo's all-or-nothing store); what crosses the wire is decided here, once:

- the media types (``application/x-protobuf``, ``application/json``) and
  ``Content-Encoding: gzip``, decompressed never past the receiver's body limit;
- the refusals of a request as a whole (:class:`RequestError`: HTTP status, the counted
  reason, a message for the sender) and one table from HTTP status to gRPC status code;
- the answer: the Export response (with its partial success) in the request's encoding,
  and for a refusal a ``google.rpc.Status`` in the request's encoding, as the OTLP/HTTP
  specification asks. Its JSON form also carries ``error`` (the message) and ``status``
  (the HTTP status), the keys of Echo's API errors, so a JSON client of either reads both.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NoReturn, TypeVar

import grpc
from google.protobuf import json_format
from google.protobuf.any_pb2 import Any as AnyMessage
from google.protobuf.message import Message
from google.rpc.error_details_pb2 import RetryInfo
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from ingero.otlp.limits import shown
from ingero.otlp.transport import JSON, PROTOBUF, SERVICES, Signal
from ingero.otlp.values import OtlpDecodeError, parse_json, parse_protobuf
from ingero.security.access import Refusal

M = TypeVar("M", bound=Message)

REQUESTS: Mapping[Signal, type[Message]] = {
    "logs": ExportLogsServiceRequest,
    "metrics": ExportMetricsServiceRequest,
}

# The reasons of the refusals made here (each daemon counts them by these names).
MALFORMED = "malformed"
TOO_LARGE = "too_large"
UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
UNSUPPORTED_ENCODING = "unsupported_encoding"
MALFORMED_GZIP = "malformed_gzip"
NOT_FOUND = "not_found"
METHOD = "method"

# A refused request's body is read and thrown away, up to this many bytes and for at most
# this long, before the connection closes: closing a socket with unread data sends a TCP
# reset, and a sender still writing its body (urllib, http.client) then sees "connection
# reset by peer" instead of the refusal. A body declared larger is not waited for: the
# refusal goes out at once and the connection closes.
DISCARD_MAX_BYTES = 16 * 1024 * 1024
DISCARD_TIMEOUT_S = 5.0

# The one table from an HTTP status to the gRPC status code of the same refusal: the code
# of a gRPC refusal, and the ``code`` of the google.rpc.Status body of an HTTP one.
GRPC_CODES: Mapping[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    411: grpc.StatusCode.INVALID_ARGUMENT,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
}


def grpc_code(status: int) -> grpc.StatusCode:
    """The gRPC status code of a refusal answered ``status`` over HTTP (UNKNOWN if none)."""
    return GRPC_CODES.get(status, grpc.StatusCode.UNKNOWN)


class RequestError(Exception):
    """A request refused as a whole: HTTP status, counted reason and a message for the sender;
    ``retry_after`` (seconds) for a 429: sent as Retry-After over HTTP, RetryInfo over gRPC."""

    def __init__(
        self, status: int, reason: str, message: str, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.retry_after = retry_after

    def __reduce__(
        self,
    ) -> tuple[type[RequestError], tuple[int, str, str, float | None]]:
        # raised in one of Echo's decoding processes, it must unpickle whole in the daemon
        return (RequestError, (self.status, self.reason, str(self), self.retry_after))


def refusal_error(refusal: Refusal, unauthorized: str) -> RequestError:
    """The gate's refusal as a RequestError; a 401 is counted as ``unauthorized``, a 429
    by its own reason (the audit log has the detail of both)."""
    reason = unauthorized if refusal.status == 401 else refusal.reason
    return RequestError(refusal.status, reason, refusal.message, refusal.retry_after)


def too_large(limit: int) -> RequestError:
    return RequestError(413, TOO_LARGE, f"request body over {limit} bytes")


def not_found() -> RequestError:
    return RequestError(404, NOT_FOUND, "Not Found")


def method_not_allowed() -> RequestError:
    return RequestError(405, METHOD, "Method Not Allowed")


def _media(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def media_type(content_type: str | None) -> str:
    """``application/x-protobuf`` or ``application/json``; RequestError(415) otherwise."""
    media = _media(content_type)
    if media not in (PROTOBUF, JSON):
        raise RequestError(
            415, UNSUPPORTED_MEDIA_TYPE, f"Content-Type must be {PROTOBUF} or {JSON}"
        )
    return media


def reply_media(content_type: str | None) -> str:
    """The encoding of the answer to a request of ``content_type``, a refusal's too: JSON
    for JSON, else protobuf (the OTLP default, also for a type that is neither)."""
    return JSON if _media(content_type) == JSON else PROTOBUF


def inflate(body: bytes, encoding: str | None, max_bytes: int) -> bytes:
    """The body after Content-Encoding, never more than ``max_bytes`` (zip bombs stop early)."""
    enc = (encoding or "identity").strip().lower()
    if enc == "identity":
        return body
    if enc != "gzip":
        raise RequestError(415, UNSUPPORTED_ENCODING, f"Content-Encoding {shown(enc)} is not gzip")
    inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
    try:
        out = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise RequestError(400, MALFORMED_GZIP, f"invalid gzip body: {exc}") from None
    if len(out) > max_bytes:
        raise RequestError(413, TOO_LARGE, f"decompressed body over {max_bytes} bytes")
    if not inflater.eof:
        raise RequestError(400, MALFORMED_GZIP, "truncated gzip body")
    return out


def parse_body(body: bytes, media: str, cls: type[M]) -> M:
    """The body as a ``cls`` message; RequestError(400, malformed) when it is not one."""
    try:
        return parse_protobuf(body, cls) if media == PROTOBUF else parse_json(body, cls)
    except OtlpDecodeError as exc:
        raise RequestError(400, MALFORMED, str(exc)) from None


def decode_request(
    body: bytes, content_type: str | None, encoding: str | None, max_bytes: int, cls: type[M]
) -> M:
    """A request body as its message: media type, gzip and parsing, each refusal a
    RequestError."""
    media = media_type(content_type)
    return parse_body(inflate(body, encoding, max_bytes), media, cls)


# ---- answers --------------------------------------------------------------------------------


@dataclass
class Reply:
    """An OTLP/HTTP answer, for either daemon's server to send."""

    status: int
    body: bytes
    content_type: str
    headers: list[tuple[str, str]] = field(default_factory=list)


def export_response(
    signal: Signal, rejected: int = 0, error_message: str = ""
) -> ExportLogsServiceResponse | ExportMetricsServiceResponse:
    """The Export response; a partial success when ``rejected`` records were refused."""
    if signal == "logs":
        logs = ExportLogsServiceResponse()
        if rejected:
            logs.partial_success.rejected_log_records = rejected
            logs.partial_success.error_message = error_message
        return logs
    metrics = ExportMetricsServiceResponse()
    if rejected:
        metrics.partial_success.rejected_data_points = rejected
        metrics.partial_success.error_message = error_message
    return metrics


def success_reply(response: Message, media: str) -> Reply:
    """200 with ``response`` in ``media``; the common answer (full success) has an empty
    message, sent as an empty body (``{}`` in JSON)."""
    if not response.ByteSize():
        return Reply(200, b"{}" if media == JSON else b"", media)
    if media == JSON:
        return Reply(200, json_format.MessageToJson(response, indent=None).encode(), JSON)
    return Reply(200, response.SerializeToString(), PROTOBUF)


def error_reply(
    status: int,
    message: str,
    media: str,
    realm: str | None = None,
    retry_after: float | None = None,
) -> Reply:
    """A refusal: ``google.rpc.Status`` in ``media`` (JSON adds ``error`` and ``status``);
    a 401 names the bearer ``realm``; ``retry_after`` becomes a Retry-After header."""
    code = grpc_code(status).value[0]
    if media == JSON:
        body = json.dumps({"code": code, "message": message, "error": message, "status": status})
        reply = Reply(status, body.encode(), JSON)
    else:
        reply = Reply(status, Status(code=code, message=message).SerializeToString(), PROTOBUF)
    if status == 401 and realm is not None:
        reply.headers.append(("WWW-Authenticate", f'Bearer realm="{realm}"'))
    if retry_after is not None:
        reply.headers.append(("Retry-After", retry_after_value(retry_after)))
    return reply


def retry_after_value(seconds: float) -> str:
    """A Retry-After header value: whole seconds (delta-seconds), at least 1."""
    return str(max(1, math.ceil(seconds)))


# ---- gRPC -----------------------------------------------------------------------------------

Export = Callable[[bytes, grpc.ServicerContext], Message]


_STATUS_DETAILS = "grpc-status-details-bin"


def abort(context: grpc.ServicerContext, error: RequestError) -> NoReturn:
    """End a gRPC call with the code of ``error``'s HTTP status and its message; with a
    ``retry_after``, the status details carry ``google.rpc.RetryInfo`` (what grpcio-status
    would send: a ``google.rpc.Status`` in the ``grpc-status-details-bin`` trailer)."""
    code = grpc_code(error.status)
    if error.retry_after is not None:
        info = RetryInfo()
        info.retry_delay.FromNanoseconds(int(error.retry_after * 1e9))
        detail = AnyMessage()
        detail.Pack(info)
        status = Status(code=code.value[0], message=str(error), details=[detail])
        context.set_trailing_metadata([(_STATUS_DETAILS, status.SerializeToString())])
    context.abort(code, str(error))
    raise AssertionError("grpc's abort() raises; its type stubs do not say so")


def grpc_handlers(exports: Mapping[Signal, Export]) -> tuple[grpc.GenericRpcHandler, ...]:
    """The Export methods of the OTLP services. Requests reach ``exports`` as raw bytes, so
    decoding (and refusing a malformed message like HTTP does) is the receiver's."""
    raw: Callable[[bytes], bytes] | None = None  # grpcio's identity deserializer
    return tuple(
        grpc.method_handlers_generic_handler(
            SERVICES[signal],
            {
                "Export": grpc.unary_unary_rpc_method_handler(
                    export,
                    request_deserializer=raw,
                    response_serializer=_serialize,
                )
            },
        )
        for signal, export in exports.items()
    )


# A second daemon on a taken gRPC port must fail to bind, not share the port silently
# (grpcio sets SO_REUSEPORT by default).
GRPC_NO_REUSEPORT = ("grpc.so_reuseport", 0)


def bind_grpc(server: grpc.Server, address: str, credentials: grpc.ServerCredentials | None) -> int:
    """Bind ``address`` on ``server`` (TLS with ``credentials``); returns the bound port.
    OSError with one line when it cannot: grpcio raises RuntimeError (newer releases) or
    returns port 0 (older ones), neither of which a person should see as a crash."""
    try:
        if credentials is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
    except RuntimeError as exc:
        raise OSError(f"cannot bind {address}: {exc}") from None
    if port == 0:
        raise OSError(f"cannot bind {address}")
    return int(port)


def peer_host(peer: str) -> str:
    """The address of a gRPC peer (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``) without its port."""
    _, _, rest = peer.partition(":")
    host = rest.rpartition(":")[0] if ":" in rest else rest
    return host.strip("[]%") or peer


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()
