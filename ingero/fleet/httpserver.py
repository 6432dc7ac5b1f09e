"""A minimal HTTP/1.1 server on an asyncio ``Protocol``: keep-alive, pipelining, TLS.

Fleet's hot path is one small POST per node every few seconds from thousands of nodes;
``http.server`` spends most of its time in per-request threads and ``email``-based header
parsing, so this server parses only what OTLP/HTTP needs (request line, headers,
``Content-Length`` bodies) on one event loop in its own thread. A ``gate`` callback sees
each request's head before its body is read, so oversized or unauthorised bodies are
refused without buffering them. Chunked request bodies are refused with 411.

A request head is at most MAX_HEAD_BYTES with at most MAX_HEADERS header lines (else 431,
however the head arrives), and must be complete within ``head_timeout`` of its first byte
(else 408 and the connection is closed), so neither a huge nor a trickled head holds
memory or a connection for long.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import cast

from ingero.otlp.receiver import DISCARD_MAX_BYTES, DISCARD_TIMEOUT_S
from ingero.security.bearer import Identity
from ingero.security.scope import ClusterScope

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024  # request line and headers, without the blank line ending them
MAX_HEADERS = 100  # header lines of one request; an OTLP exporter sends about ten
IDLE_TIMEOUT_S = 120.0
_SWEEP_S = 5.0
_REASONS = {s.value: s.phrase for s in HTTPStatus}


@dataclass
class HttpRequest:
    method: str
    path: str
    query: str
    headers: dict[str, str]  # lower-case names; repeated headers keep the last value
    body: bytes = b""
    peer: str = ""  # the client's address (the audit log's and rate limits' source)
    # Who the pre-body gate let in: the handler judges the body by its token's scope.
    identity: Identity[ClusterScope] | None = None


@dataclass
class HttpResponse:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)
    close: bool = False


Handler = Callable[[HttpRequest], HttpResponse]
Gate = Callable[[HttpRequest, int], HttpResponse | None]
"""Sees (head without body, Content-Length) first; a response refuses the request."""


def render(response: HttpResponse, keep_alive: bool, head_only: bool = False) -> bytes:
    """The response on the wire; ``head_only`` (a HEAD request) keeps Content-Length but
    sends no body."""
    lines = [
        f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Unknown')}",
        f"Content-Length: {len(response.body)}",
        f"Content-Type: {response.content_type}",
    ]
    lines.extend(f"{name}: {value}" for name, value in response.headers)
    if not keep_alive:
        lines.append("Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + response.body


class _Connection(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._buffer = bytearray()
        self._head: HttpRequest | None = None
        self._need = 0
        self._keep_alive = True
        self._scanned = 0  # bytes of the buffer already searched for the head's end
        self._head_timer: asyncio.TimerHandle | None = None
        self._discarding = 0  # bytes of a refused body still to drop before closing
        self._discard_timer: asyncio.TimerHandle | None = None
        self.transport: asyncio.Transport | None = None
        self.last_active = 0.0
        self.peer = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        peername = transport.get_extra_info("peername")
        self.peer = str(peername[0]) if isinstance(peername, tuple) and peername else ""
        self.last_active = self._server.loop_time()
        self._server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self.transport = None
        self._stop_head_timer()
        if self._discard_timer is not None:
            self._discard_timer.cancel()

    # A client that sends requests but never reads the replies stops being read from
    # once the transport's write buffer is full, so memory stays bounded.
    def pause_writing(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self.last_active = self._server.loop_time()
        if self._discarding:
            self._discarding -= min(len(data), self._discarding)
            if not self._discarding and self.transport is not None:
                self.transport.close()
            return
        self._buffer += data
        self._serve_buffer()
        if (
            self._head is None
            and self._buffer
            and self._head_timer is None
            and self.transport is not None
            and not self.transport.is_closing()
        ):
            # Part of a head is waiting for the rest (most heads come in one read, so
            # most requests never arm a timer).
            self._head_timer = self._server.call_later(
                self._server.head_timeout, self._head_timed_out
            )

    def _serve_buffer(self) -> None:
        while self.transport is not None and not self.transport.is_closing():
            if self._head is None and not self._read_head():
                return
            if len(self._buffer) < self._need:
                return
            assert self._head is not None
            request, self._head = self._head, None
            request.body = bytes(self._buffer[: self._need])
            del self._buffer[: self._need]
            self._respond(self._server.call(request), request.method == "HEAD")

    def _read_head(self) -> bool:
        # Only the first MAX_HEAD_BYTES (+ the blank line) may hold the head's end, and
        # what was searched before is not searched again: a head trickled in small
        # pieces costs no more than one sent at once.
        limit = MAX_HEAD_BYTES + 4
        end = self._buffer.find(b"\r\n\r\n", max(0, self._scanned - 3), limit)
        if end < 0:
            self._scanned = min(len(self._buffer), limit)
            if len(self._buffer) >= limit:
                self._fail(431, f"request head over {MAX_HEAD_BYTES} bytes")
            return False
        self._scanned = 0
        self._stop_head_timer()
        raw = bytes(self._buffer[:end])
        del self._buffer[: end + 4]
        try:
            request, length, self._keep_alive = _parse_head(raw)
        except BadHead as exc:
            self._fail(exc.status, str(exc))
            return False
        request.peer = self.peer
        refused = self._server.gate(request, length) if self._server.gate else None
        if refused is not None:
            # The body was not read, so the connection cannot carry another request.
            refused.close = True
            self._respond(refused, request.method == "HEAD", discard=length)
            return False
        if length and request.headers.get("expect", "").lower() == "100-continue":
            # curl waits for this before sending a body over 1 KiB.
            assert self.transport is not None
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._head = request
        self._need = length
        return True

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport is not None and self._head is None and self._buffer:
            self._fail(408, f"request head not complete within {self._server.head_timeout:g} s")

    def _fail(self, status: int, message: str) -> None:
        self._server.count_protocol_error(status)
        self._respond(HttpResponse(status, (message + "\n").encode(), close=True))

    def _respond(self, response: HttpResponse, head_only: bool = False, discard: int = 0) -> None:
        """Write ``response``; close after it unless kept alive. ``discard``: the length of
        the refused request's body, read and dropped first (see DISCARD_MAX_BYTES)."""
        if self.transport is None:
            return
        keep_alive = self._keep_alive and not response.close
        self.transport.write(render(response, keep_alive, head_only))
        if keep_alive:
            return
        rest = discard - len(self._buffer)
        self._buffer.clear()
        if rest <= 0 or discard > DISCARD_MAX_BYTES:
            self.transport.close()
            return
        # The answer is already on its way; the rest of the body is dropped as it comes
        # (bounded in bytes and time) so the close carries no unread data, which would
        # be a reset the sender sees instead of the answer.
        self._discarding = rest
        self._discard_timer = self._server.call_later(DISCARD_TIMEOUT_S, self._discard_timed_out)

    def _discard_timed_out(self) -> None:
        self._discard_timer = None
        if self.transport is not None:
            self.transport.close()


class BadHead(ValueError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _parse_head(raw: bytes) -> tuple[HttpRequest, int, bool]:
    """(request without body, Content-Length, keep-alive) or BadHead with the reason."""
    if raw.count(b"\r\n") > MAX_HEADERS:
        raise BadHead(431, f"more than {MAX_HEADERS} header lines")
    text = raw.decode("latin-1")
    request_line, *header_lines = text.split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3:
        raise BadHead(400, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise BadHead(505, f"unsupported HTTP version {version!r}")
    headers: dict[str, str] = {}
    for line in header_lines:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadHead(400, "malformed header line")
        headers[name.lower()] = value.strip()
    if "transfer-encoding" in headers:
        raise BadHead(411, "chunked request bodies are not accepted; send Content-Length")
    length_text = headers.get("content-length", "0")
    if not length_text.isdigit():
        raise BadHead(400, "invalid Content-Length")
    connection = headers.get("connection", "").lower()
    keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
    path, _, query = target.partition("?")
    return HttpRequest(method, path, query, headers), int(length_text), keep_alive


class HttpServer:
    """Serves ``handler`` on (host, port) from a dedicated event-loop thread."""

    def __init__(
        self,
        name: str,
        host: str,
        port: int,
        handler: Handler,
        gate: Gate | None = None,
        ssl_context: ssl.SSLContext | None = None,
        on_protocol_error: Callable[[int], None] | None = None,
        *,
        head_timeout: float,
    ) -> None:
        self.name = name
        self.head_timeout = head_timeout
        self.host = host
        self.port = port
        self.handler = handler
        self.gate = gate
        self.connections: set[_Connection] = set()
        self._ssl = ssl_context
        self._on_protocol_error = on_protocol_error
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None

    def loop_time(self) -> float:
        return self._loop.time()

    def call_later(self, delay: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return self._loop.call_later(delay, callback)

    def call(self, request: HttpRequest) -> HttpResponse:
        try:
            return self.handler(request)
        except Exception:
            log.exception("%s: handler failed on %s %s", self.name, request.method, request.path)
            return HttpResponse(500, b"internal error\n")

    def count_protocol_error(self, status: int) -> None:
        if self._on_protocol_error is not None:
            self._on_protocol_error(status)

    def start(self) -> int:
        """Bind (raises OSError when the address is taken) and serve; returns the bound port."""
        self._server = self._loop.run_until_complete(
            self._loop.create_server(
                lambda: _Connection(self),
                self.host,
                self.port,
                ssl=self._ssl,
                reuse_address=True,
                backlog=2048,
            )
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._thread = threading.Thread(target=self._run, name=f"http-{self.name}", daemon=True)
        self._thread.start()
        return self.port

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        sweeper = self._loop.create_task(self._sweep_idle())
        self._loop.run_forever()
        sweeper.cancel()
        self._loop.run_until_complete(asyncio.gather(sweeper, return_exceptions=True))
        self._loop.close()

    async def _sweep_idle(self) -> None:
        # A client that opens a connection and goes quiet would otherwise hold it forever.
        while True:
            await asyncio.sleep(_SWEEP_S)
            horizon = self._loop.time() - IDLE_TIMEOUT_S
            for conn in [c for c in self.connections if c.last_active < horizon]:
                if conn.transport is not None:
                    conn.transport.close()

    def stop(self) -> None:
        if self._thread is None:
            return

        async def shutdown() -> None:
            assert self._server is not None
            self._server.close()
            for conn in list(self.connections):
                if conn.transport is not None:
                    conn.transport.close()
            await asyncio.sleep(0)
            self._loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop)
        self._thread.join(timeout=5)
        self._thread = None
