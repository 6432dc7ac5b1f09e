"""The sink daemon: accepts fleet-push connections on a Unix socket, serves /metrics."""

from __future__ import annotations

import logging
import os
import selectors
import socket
import threading
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ingero.runtime.buildinfo import daemon_registry
from ingero.schema.events import Event
from ingero.sink.state import MAX_LINE_BYTES, SinkState

log = logging.getLogger(__name__)


class _StateCollector(Collector):
    def __init__(self, state: SinkState, lock: threading.Lock) -> None:
        self._state, self._lock = state, lock

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            events = dict(self._state.events)
            stragglers = sorted(self._state.stragglers)
            errors, dropped = self._state.parse_errors, self._state.dropped
        total = CounterMetricFamily(
            "ingero_sink_events", "Events received, by type.", labels=["type"]
        )
        for kind, count in sorted(events.items()):
            total.add_metric([kind], count)
        active = GaugeMetricFamily(
            "ingero_sink_active_stragglers",
            "1 for each node whose straggler episode is open.",
            labels=["cluster_id", "node_id"],
        )
        for cluster, node in stragglers:
            active.add_metric([cluster, node], 1)
        yield total
        yield active
        yield CounterMetricFamily(
            "ingero_sink_parse_errors", "Lines that were not valid events.", value=errors
        )
        yield CounterMetricFamily(
            "ingero_sink_dropped", "Lines dropped (over the size limit).", value=dropped
        )


class Sink:
    """Reads NDJSON from any number of clients; ``on_event`` sees every valid event."""

    def __init__(self, socket_path: str, on_event: Callable[[Event], None] | None = None) -> None:
        self.state = SinkState()
        self.lock = threading.Lock()
        self.registry = daemon_registry("sink")
        self.registry.register(_StateCollector(self.state, self.lock))
        self._on_event = on_event
        self._path = Path(socket_path)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        if self._path.is_socket():
            self._path.unlink()  # a stale socket from a previous run
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self._server.bind(str(self._path))
        os.chmod(self._path, 0o666)  # fleet-push runs as another, unprivileged user
        self._server.listen(64)
        self._server.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._server, selectors.EVENT_READ)
        self._buffers: dict[socket.socket, bytearray] = {}

    def serve(self, stop: threading.Event) -> None:
        while not stop.is_set():
            for key, _mask in self._selector.select(timeout=0.2):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self._server:
                    self._accept()
                else:
                    self._read(sock)

    def close(self) -> None:
        for sock in list(self._buffers):
            self._drop(sock)
        self._selector.close()
        self._server.close()
        self._path.unlink(missing_ok=True)

    def _accept(self) -> None:
        try:
            conn, _ = self._server.accept()
        except BlockingIOError:
            return
        conn.setblocking(False)
        self._buffers[conn] = bytearray()
        self._selector.register(conn, selectors.EVENT_READ)

    def _read(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(sock)
            return
        buf = self._buffers[sock]
        buf += data
        while (end := buf.find(b"\n")) >= 0:
            line = bytes(buf[:end])
            del buf[: end + 1]
            self._feed(line)
        if len(buf) > MAX_LINE_BYTES:
            # A line this long cannot be an event: drop it up to its end.
            self._feed(bytes(buf))
            buf.clear()

    def _feed(self, line: bytes) -> None:
        with self.lock:
            event = self.state.feed(line)
        if event is not None and self._on_event is not None:
            self._on_event(event)

    def _drop(self, sock: socket.socket) -> None:
        self._selector.unregister(sock)
        self._buffers.pop(sock, None)
        sock.close()


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> ThreadingHTTPServer:
    """/metrics over HTTP in a daemon thread; returns the server (``shutdown()`` to stop)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = self._answer()
            if body is not None:
                self.wfile.write(body)

        def do_HEAD(self) -> None:  # what a probe or `curl -I` sends
            self._answer()

        def _answer(self) -> bytes | None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return None
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            return body

        def log_message(self, format: str, *args: object) -> None:
            log.debug("metrics: " + format, *args)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="sink-metrics", daemon=True).start()
    return server
