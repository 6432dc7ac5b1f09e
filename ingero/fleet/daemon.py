"""``ingero fleet``: the OTLP receivers, the API and the tick loop wired around FleetState.

Threads: one event loop per HTTP listener (OTLP/HTTP, API), gRPC's worker pool, and the
tick thread, which alone runs ``state.tick()``, updates the group gauges, calls the tick
listeners (the drain controller), delivers events to the sinks and pings the watchdog.
Nothing of that runs on the ingest path.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from ingero.fleet.api import ApiHandler
from ingero.fleet.config import FleetConfig
from ingero.fleet.events import EventQueue, EventSink, JournalSink
from ingero.fleet.forwarder import Forwarder
from ingero.fleet.grpc_server import OtlpGrpcServer
from ingero.fleet.httpserver import HttpServer
from ingero.fleet.idle_gpus import IdleGpuLedger
from ingero.fleet.metrics import FleetMetrics
from ingero.fleet.model import TickResult
from ingero.fleet.otlp_http import OtlpHttpHandler
from ingero.fleet.receiver import Receiver
from ingero.fleet.scope import scoped_tokens
from ingero.fleet.score_history import ScoreHistory
from ingero.fleet.spool import EventSpool
from ingero.fleet.state import FleetState
from ingero.otlp.resource import FLEET_SERVICE, service_attributes
from ingero.runtime.clock import Clock, SystemClock
from ingero.runtime.hangup import StartupHangups
from ingero.runtime.signals import SignalEvent, StopSignals
from ingero.runtime.systemd import Notifier, watchdog_interval
from ingero.runtime.systemd import notifier as systemd_notifier
from ingero.security.access import Gate, reload_material
from ingero.security.audit import AuditLog, warn_open_listeners
from ingero.security.bearer import Keyring, NamedToken, TokenFile, load_token_files
from ingero.security.scope import ClusterScope
from ingero.security.tls import server_tls

log = logging.getLogger(__name__)

TickListener = Callable[[TickResult], None]


def split_hostport(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as (host, port); validated by the config schema."""
    host, _, port = value.rpartition(":")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class BoundAddresses:
    otlp_grpc: str
    otlp_http: str
    api: str

    def to_json(self) -> dict[str, object]:
        return {"otlp_grpc": self.otlp_grpc, "otlp_http": self.otlp_http, "api": self.api}


def fleet_metrics(config: FleetConfig) -> FleetMetrics:
    """The metrics registry; per-node series only when ``metrics.node_series`` asks."""
    limit = config.metrics.node_series_limit
    return FleetMetrics(limit if config.metrics.node_series else None, clock_offset_limit=limit)


def echo_forwarder(config: FleetConfig) -> Forwarder | None:
    """The forwarder of events to Echo, None without ``echo.endpoint``. Its token:
    ``echo.token_file`` (re-read when it changes), else ``INGERO_ECHO_TOKEN``."""
    echo = config.echo
    if not echo.endpoint:
        return None
    return Forwarder(
        echo.endpoint,
        token=(
            TokenFile(echo.token_file, "echo.token_file")
            if echo.token_file
            else os.environ.get("INGERO_ECHO_TOKEN")
        ),
        # One Fleet per host and API address: stable across restarts.
        service=service_attributes(FLEET_SERVICE, f"{socket.gethostname()}/{config.listen.api}"),
        spool=(
            EventSpool(echo.spool_dir, echo.spool_max_events, echo.spool_max_bytes)
            if echo.spool_dir
            else None
        ),
    )


def score_history(
    config: FleetConfig, forwarder: Forwarder | None, clock: Clock
) -> ScoreHistory | None:
    """Score samples for Echo every ``echo.score_history_interval``; None without a
    forwarder or with the interval 0."""
    interval = float(config.echo.score_history_interval)
    return ScoreHistory(interval, clock) if forwarder is not None and interval else None


class FleetDaemon:
    def __init__(
        self,
        config: FleetConfig,
        clock: Clock | None = None,
        notifier: Notifier | None = None,
        read_config: Callable[[], FleetConfig] | None = None,
    ) -> None:
        self.config = config
        # Reads the configuration file again on SIGHUP (for the tokens' scopes); None: the
        # scopes of ``config`` stay.
        self._read_config = read_config
        self.metrics = fleet_metrics(config)
        clock = clock or SystemClock()
        self.state = FleetState(config, clock)
        self.events = EventQueue(self.metrics)
        self.journal = JournalSink()
        self.events.add_sink(self.journal, "journal")
        # The nodes' gpu_idle events, summed into the idle GPU time gauges of /metrics.
        self.idle_gpus = IdleGpuLedger(
            clock, 8 * config.limits.max_nodes, config.metrics.idle_gpu_series_limit
        )
        self.events.add_sink(self.idle_gpus, "idle-gpus")
        self.metrics.read_idle_gpus(self.idle_gpus.render)
        # Events go on to Echo when configured; the forwarder never blocks the tick thread.
        self.echo_forwarder = echo_forwarder(config)
        if self.echo_forwarder is not None:
            self._forward_events(self.echo_forwarder)
        self.score_history = score_history(config, self.echo_forwarder, clock)
        self.receiver = Receiver(self.state, self.metrics, self.events, clock)
        self._notifier = notifier or systemd_notifier()
        self._tick_listeners: list[tuple[str, TickListener]] = []
        self._stop = SignalEvent()  # both set by SIGTERM (run_until_signal)
        self._tick_thread: threading.Thread | None = None
        self._last_tick_ok: float | None = None
        self._started = False
        if self.score_history is not None:
            self.add_tick_listener(self._forward_scores, "echo-score-history")
        self.add_tick_listener(lambda r: self.idle_gpus.expire(r.expired_nodes), "idle-gpus")

        self._reload_requested = False
        self._wake = SignalEvent()
        self.keyring = Keyring(
            self._load_tokens(config.auth.token_clusters), float(config.auth.token_grace)
        )
        self.audit = AuditLog("fleet")
        self.gate: Gate[ClusterScope] = Gate(self.keyring, None, config.auth.rate_limit, self.audit)
        self.tls = server_tls(config.auth.tls_cert, config.auth.tls_key)
        self._otlp_http, self._api, self._grpc = self._listeners()

    def _forward_events(self, forwarder: Forwarder) -> None:
        self.metrics.read_echo_forwarding(forwarder.figures)
        # With a spool, in the receiver's thread: a node's events are on disk before its
        # request is acknowledged, not in memory until the next tick.
        self.events.add_sink(forwarder, "echo", immediate=self.config.echo.spool_dir is not None)

    def _listeners(self) -> tuple[HttpServer, HttpServer, OtlpGrpcServer]:
        """OTLP/HTTP, the API and OTLP/gRPC, behind the one gate (and TLS, if set)."""
        config = self.config
        max_body = config.limits.max_body_bytes
        otlp = OtlpHttpHandler(self.receiver, self.metrics, self.gate, max_body)
        api = ApiHandler(self.state, self.metrics, self.gate, self.ready)
        ssl_context = self.tls.ssl_context() if self.tls is not None else None

        def http_server(
            name: str, hostport: str, handler: OtlpHttpHandler | ApiHandler
        ) -> HttpServer:
            host, port = split_hostport(hostport)
            return HttpServer(
                name,
                host,
                port,
                handler,
                handler.gate,
                ssl_context,
                self._protocol_error,
                head_timeout=float(config.limits.head_timeout),
            )

        otlp_http = http_server("otlp-http", config.listen.otlp_http, otlp)
        api_http = http_server("api", config.listen.api, api)
        grpc = OtlpGrpcServer(
            config.listen.otlp_grpc,
            self.receiver,
            self.metrics,
            self.gate,
            max_body,
            self.tls.grpc_credentials() if self.tls is not None else None,
        )
        return otlp_http, api_http, grpc

    def _protocol_error(self, status: int) -> None:
        self.metrics.count_rejected({f"http_{status}": 1})

    def _load_tokens(self, token_clusters: dict[str, list[str]]) -> list[NamedToken[ClusterScope]]:
        auth = self.config.auth
        files = {"auth.token_file": auth.token_file or ""}
        files.update({f"auth.token_files[{i}]": path for i, path in enumerate(auth.token_files)})
        return scoped_tokens(load_token_files(files, auth.token_dir), token_clusters)

    def _reload_tokens(self) -> list[NamedToken[ClusterScope]]:
        """The token files again, with the scopes (``auth.token_clusters``) of the
        configuration file as it is now; the rest of the file needs a restart."""
        config = self._read_config() if self._read_config is not None else self.config
        return self._load_tokens(config.auth.token_clusters)

    def reload(self) -> bool:
        """SIGHUP: token files and their scopes, certificate and key again
        (``ingero.security.access``)."""
        return reload_material("fleet", self.keyring, self._reload_tokens, self.tls)

    # ---- extension points ---------------------------------------------------------

    def add_tick_listener(self, listener: TickListener, name: str | None = None) -> None:
        """Call ``listener(result)`` after every tick, on the tick thread; errors are counted."""
        self._tick_listeners.append(
            (name or str(getattr(listener, "__name__", listener)), listener)
        )

    def add_event_sink(self, sink: EventSink, name: str | None = None) -> None:
        """Every event Fleet publishes (its own and those pushed as OTLP logs) goes here."""
        self.events.add_sink(sink, name)

    def _forward_scores(self, result: TickResult) -> None:
        """A downsampled score sample per node to Echo; only queued here, sent elsewhere."""
        history, forwarder = self.score_history, self.echo_forwarder
        if history is not None and forwarder is not None and history.due():
            forwarder.submit_scores(history.take(self.state.scores_snapshot()))

    # ---- life cycle -----------------------------------------------------------------

    def start(self) -> BoundAddresses:
        """Bind every listener (OSError when one cannot), start ticking, send READY=1."""
        raise_open_files_limit()
        started: list[Callable[[], None]] = []
        try:
            grpc_port = self._grpc.start()
            started.append(self._grpc.stop)
            http_port = self._otlp_http.start()
            started.append(self._otlp_http.stop)
            api_port = self._api.start()
            started.append(self._api.stop)
        except OSError:
            for stop in reversed(started):
                stop()
            raise
        grpc_host, _ = split_hostport(self.config.listen.otlp_grpc)
        bound = BoundAddresses(
            otlp_grpc=f"{grpc_host}:{grpc_port}",
            otlp_http=f"{self._otlp_http.host}:{http_port}",
            api=f"{self._api.host}:{api_port}",
        )
        self._started = True
        self._last_tick_ok = time.monotonic()
        self._tick_thread = threading.Thread(target=self._tick_loop, name="fleet-tick", daemon=True)
        self._tick_thread.start()
        warn_open_listeners(
            "fleet",
            {"otlp_grpc": bound.otlp_grpc, "otlp_http": bound.otlp_http, "api": bound.api},
            self.keyring.enabled,
        )
        log.info(
            "fleet listening: otlp_grpc=%s otlp_http=%s api=%s",
            bound.otlp_grpc,
            bound.otlp_http,
            bound.api,
        )
        self._notifier.notify("READY=1\nSTATUS=listening, waiting for the first tick")
        return bound

    def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        self._notifier.notify("STOPPING=1")
        self._stop.set()
        self._grpc.stop()
        self._otlp_http.stop()
        self._api.stop()
        if self._tick_thread is not None:
            self._tick_thread.join(timeout=10)
        self.events.deliver()  # what arrived before the listeners closed is not lost
        if self.echo_forwarder is not None:
            self.echo_forwarder.close(timeout=10)
        self.audit.close()
        self.journal.close()

    def ready(self) -> bool:
        """Listening, and the tick thread has ticked within three intervals."""
        last = self._last_tick_ok
        interval = float(self.config.push_interval)
        return self._started and last is not None and time.monotonic() - last < 3 * interval

    def run_until_signal(self, hangups: StartupHangups | None = None) -> None:
        """Serve until SIGTERM or SIGINT, then shut down cleanly; SIGHUP reloads (once for
        any that ``hangups`` caught while Fleet was starting)."""

        def hangup(signum: int, frame: FrameType | None) -> None:
            # only a flag here: the reload runs on the main loop below, not in the handler
            self._reload_requested = True
            self._wake.set()

        stop_signals = StopSignals(self._stop, also=self._wake.set).install()
        signal.signal(signal.SIGHUP, hangup)
        if hangups is not None and hangups.take():  # after ours is in place: none is missed
            self._reload_requested = True
            self._wake.set()
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            if self._reload_requested and not self._stop.is_set():
                self._reload_requested = False
                self.reload()
        if stop_signals.received is not None:
            log.info("fleet: %s received, shutting down", stop_signals.name)
        self.stop()

    # ---- tick thread ----------------------------------------------------------------

    def _tick_loop(self) -> None:
        interval = float(self.config.push_interval)
        watchdog = watchdog_interval()
        next_tick = time.monotonic() + interval
        next_ping = time.monotonic()
        while True:
            now = time.monotonic()
            due = min(next_tick, next_ping) if watchdog else next_tick
            if self._stop.wait(max(0.0, due - now)):
                return
            now = time.monotonic()
            if now >= next_tick:
                next_tick += interval
                if next_tick <= now:  # after a stall, realign rather than tick in a burst
                    next_tick = now + interval
                self.tick_once()
            if watchdog and now >= next_ping:
                next_ping = now + watchdog
                # Only while ticks progress: a wedged or failing tick must trip the watchdog.
                if (
                    self._last_tick_ok is not None
                    and now - self._last_tick_ok < 2 * interval + watchdog
                ):
                    self._notifier.notify("WATCHDOG=1")

    def tick_once(self) -> TickResult | None:
        """One tick and everything after it; failures are logged and counted, never fatal."""
        start = time.perf_counter()
        try:
            result = self.state.tick()
        except Exception:
            log.exception("fleet: tick failed")
            self.metrics.ticks_failed.inc()
            return None
        self.metrics.update_groups(result.groups)
        if self.config.metrics.node_series:
            flagged = {(v.cluster_id, v.node_id) for v in result.verdicts if v.straggler}
            rows = self.state.scores_snapshot(self.config.metrics.node_series_limit, flagged)
            live = sum(g.active_nodes + g.idle_nodes for g in result.groups)
            self.metrics.update_nodes(rows, flagged, live)
        nodes = self.state.node_count()
        self.metrics.tracked_nodes.set(nodes)
        self.metrics.update_nccl(
            result.nccl_comms,
            result.hung_comms,
            result.nccl_refused,
            (
                e.type
                for e in result.events
                if e.type in ("peer_lag", "collective_hang", "collective_wait")
                and e.extra.get("state") == "start"
                and not e.extra.get("repeat")
            ),
            result.waiting_comms,
            result.waiting_nodes,
        )
        self.metrics.update_clock_offsets(self.state.clock_offsets())
        self.metrics.owned_clusters.set(result.owned_clusters)
        if result.taken_over:
            self.metrics.takeovers.inc(len(result.taken_over))
            shown = ", ".join(result.taken_over[:10])
            more = f" and {len(result.taken_over) - 10} more" if len(result.taken_over) > 10 else ""
            # A takeover after another replica died (or at start): thresholds rebuild from
            # the next pushes, and no drain until the ownership rule holds again.
            log.info("fleet: took over cluster(s) %s%s", shown, more)
        self.events.submit(result.events, source="tick")
        for name, listener in list(self._tick_listeners):
            try:
                listener(result)
            except Exception:
                log.exception("fleet: tick listener %s failed", name)
                self.metrics.listener_errors.labels(name).inc()
        self.events.deliver()
        self._last_tick_ok = time.monotonic()
        self.metrics.tick_seconds.observe(time.perf_counter() - start)
        stragglers = sum(g.straggler_count for g in result.groups)
        panics = sum(1 for g in result.groups if g.panic)
        self._notifier.notify(
            f"STATUS={nodes} nodes in {len(result.groups)} groups, "
            f"{stragglers} stragglers, {panics} groups in panic"
        )
        return result


def raise_open_files_limit() -> None:
    """Every agent holds a keep-alive connection: lift the soft fd limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:  # NOFILE cannot be set to infinity
        hard = 1 << 20
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.warning("fleet: cannot raise the open files limit from %d: %s", soft, exc)
            return
    log.info("fleet: up to %s open connections (RLIMIT_NOFILE)", hard)


def write_ready_file(path: str, bound: BoundAddresses) -> None:
    """The bound addresses as JSON, written atomically (tests and scripts wait for it)."""
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps({**bound.to_json(), "pid": os.getpid()}) + "\n")
    tmp.replace(target)
