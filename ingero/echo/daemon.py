"""``ingero echo``: wires the store, the OTLP receivers and the API/MCP servers together.

One process, one asyncio loop for the two HTTP servers (API+MCP, OTLP/HTTP), gRPC on its
own thread pool, and the store's single writer thread. SIGTERM/SIGINT stop the servers
(in-flight requests finish and get their commit acknowledged), then the store commits
what is queued and releases its lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Generator
from typing import Any

import uvicorn

from ingero.echo.api import build_app
from ingero.echo.auth import TokenTable
from ingero.echo.config import EchoConfig
from ingero.echo.decoding import DecodePool
from ingero.echo.ingest import Ingest
from ingero.echo.mcp_server import LocalBackend, build_server
from ingero.echo.rates import GpuRates
from ingero.echo.service import Service
from ingero.echo.store import Store
from ingero.runtime.clock import Clock, SystemClock
from ingero.runtime.errors import UnavailableError
from ingero.runtime.hangup import StartupHangups
from ingero.runtime.systemd import notifier
from ingero.security.access import Gate, reload_material
from ingero.security.audit import AuditLog, warn_open_listeners
from ingero.security.tls import server_tls

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals to the daemon (two servers share one loop)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def _split(hostport: str) -> tuple[str, int]:
    host, _, port = hostport.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


def _bind(hostport: str, what: str) -> socket.socket:
    """Bind before serving, so a taken port is one clear error instead of a log line."""
    host, port = _split(hostport)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UnavailableError(f"cannot listen for {what} on {hostport}: {exc}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class EchoDaemon:
    def __init__(self, config: EchoConfig, clock: Clock | None = None) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        self.tokens = TokenTable.load(config.auth.token_table, float(config.auth.token_grace))
        rates = GpuRates.load(config.gpu_rates_file)
        # Checked now, so a bad certificate is one configuration error before anything runs.
        self.tls = server_tls(config.auth.tls_cert, config.auth.tls_key)
        self.audit = AuditLog("echo")
        self.gate = Gate(self.tokens.keyring, None, config.auth.rate_limit, self.audit)
        self.store = Store(
            config.db,
            clock=self.clock,
            score_bucket=float(config.limits.score_bucket),
            max_age=float(config.retention.max_age),
            max_bytes=config.retention.max_bytes,
            retention_interval=float(config.retention.check_interval),
        )
        self.decoder = DecodePool(config.limits.decode_worker_count())
        self.ingest = Ingest(
            self.store,
            config.limits.max_body_bytes,
            config.limits.max_events_per_request,
            self.gate if config.auth.ingest_requires_token else None,
            self.decoder,
        )
        self.service = Service(
            config.db,
            rates,
            clock=self.clock,
            max_rows=config.limits.query_max_rows,
            sql_max_rows=config.limits.sql_max_rows,
            sql_timeout=float(config.limits.sql_timeout),
            max_answer_bytes=config.limits.max_answer_bytes,
            status=self.status,
        )
        self._servers: list[_Server] = []
        # /readyz: every listener serving, and no SIGTERM yet.
        self.ready = False

    def status(self) -> dict[str, Any]:
        return {
            "ingest": self.ingest.stats.snapshot(),
            "store": dict(self.store.stats),
        }

    async def run(self, hangups: StartupHangups | None = None) -> None:
        """Serve until SIGTERM or SIGINT; SIGHUP reloads (once, when ready, for any that
        ``hangups`` caught while Echo was starting)."""
        api_host, _ = _split(self.config.listen.api)
        tls: dict[str, Any] = (
            {"ssl_certfile": self.config.auth.tls_cert, "ssl_keyfile": self.config.auth.tls_key}
            if self.tls is not None
            else {}
        )
        mcp = build_server(LocalBackend(self.service, self.tokens))
        mcp_routes = []
        if self.config.mcp_http:
            mcp_app = mcp.streamable_http_app(
                streamable_http_path="/mcp",
                stateless_http=True,
                json_response=True,
                host=api_host,
            )
            mcp_routes = list(mcp_app.routes)
        app = build_app(
            self.service,
            self.gate,
            mcp_routes=mcp_routes,
            mcp_lifespan=mcp.session_manager.run if self.config.mcp_http else None,
            ready=lambda: self.ready,
        )
        try:
            api_sock = _bind(self.config.listen.api, "the API")
        except BaseException:
            self._close()
            raise
        try:
            otlp_sock = _bind(self.config.listen.otlp_http, "OTLP/HTTP")
        except BaseException:
            api_sock.close()
            self._close()
            raise
        self._servers = [
            # room for long query strings, so the app (not h11) answers them, as JSON
            _Server(
                uvicorn.Config(
                    app,
                    log_level="warning",
                    lifespan="on",
                    h11_max_incomplete_event_size=256_000,
                    **tls,
                )
            ),
            _Server(
                uvicorn.Config(self.ingest.http_app(), log_level="warning", lifespan="off", **tls)
            ),
        ]
        if self.tls is not None:
            for server in self._servers:
                # uvicorn's own context would be fixed at start; ours swaps on SIGHUP
                server.config.load()
                server.config.ssl = self.tls.ssl_context()
        try:
            grpc_server, grpc_port = self.ingest.grpc_server(
                self.config.listen.otlp_grpc,
                self.tls.grpc_credentials() if self.tls is not None else None,
            )
        except BaseException:
            api_sock.close()
            otlp_sock.close()
            self._close()
            raise
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        try:
            tasks = [
                asyncio.create_task(server.serve(sockets=[sock]))
                for server, sock in zip(self._servers, (api_sock, otlp_sock), strict=True)
            ]
            while not all(s.started for s in self._servers) and not any(t.done() for t in tasks):
                await asyncio.sleep(0.02)
            listen = self.config.listen
            warn_open_listeners(
                "echo",
                {"api": listen.api, "otlp_http": listen.otlp_http, "otlp_grpc": listen.otlp_grpc},
                self.tokens.enabled,
            )
            log.info(
                "echo ready: api %s, otlp http %s, otlp grpc port %d, db %s",
                self.config.listen.api,
                self.config.listen.otlp_http,
                grpc_port,
                self.config.db,
            )
            self.ready = True
            notifier().notify("READY=1")
            if hangups is not None and hangups.take():  # our handler is in place by now
                self.reload()
            await asyncio.gather(*tasks)
        finally:
            notifier().notify("STOPPING=1")
            grpc_server.stop(grace=5).wait()
            self._close()
            api_sock.close()
            otlp_sock.close()

    def _close(self) -> None:
        """Stop the decoding workers, then commit what is queued and release the store."""
        self.decoder.close()
        self.store.close()
        self.audit.close()

    def reload(self) -> bool:
        """SIGHUP: the token table, certificate and key again (``ingero.security.access``)."""
        path = self.config.auth.token_table
        return reload_material("echo", self.tokens.keyring, lambda: TokenTable.read(path), self.tls)

    def stop(self) -> None:
        self.ready = False
        for server in self._servers:
            server.should_exit = True
