"""OTLP request bodies decoded into events and score points, optionally in worker processes.

Decoding and validating costs ~8 µs of Python per event. In the daemon's one process that
time holds the GIL the store's writer needs, so the two would take turns on one core; a
pool of worker processes (``limits.decode_workers``) decodes on the other cores and sends
back the validated events as the rows the store inserts (a tuple unpickles in ~0.3 µs).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import multiprocessing
import os
import threading
import time
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from ingero.echo.rows import EventRow, ScorePoint, event_row
from ingero.otlp.health import decode_health
from ingero.otlp.limits import TOO_LONG
from ingero.otlp.logs import decode_events
from ingero.otlp.receiver import REQUESTS, RequestError, parse_body
from ingero.otlp.transport import Signal
from ingero.runtime.errors import UnavailableError
from ingero.schema.events import Event

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Decoded:
    """One request's validated records: events as the rows the store inserts, or scores."""

    rows: list[EventRow] = field(default_factory=list)
    scores: list[ScorePoint] = field(default_factory=list)


def _reason(reasons: dict[str, int], invalid: str) -> str:
    """The counted reason of a refused request: ``too_long`` when a record was over a size
    limit (an operator may need to know that a sender outgrew them), else ``invalid``."""
    return TOO_LONG if TOO_LONG in reasons else invalid


def logs_to_events(request: ExportLogsServiceRequest, max_events: int) -> list[Event]:
    """Every log record as an Event, or RequestError naming what is wrong."""
    total = sum(len(sl.log_records) for rl in request.resource_logs for sl in rl.scope_logs)
    if total > max_events:
        raise RequestError(
            413,
            "too_many_records",
            f"{total} log records in one request, the limit is {max_events}",
        )
    decoded = decode_events(request)
    if decoded.rejected:
        raise RequestError(
            400,
            _reason(decoded.reasons, "invalid_event"),
            f"{decoded.rejected} of {total} log records rejected, nothing stored: "
            + decoded.error_message,
        )
    return decoded.events


def metrics_to_scores(
    request: ExportMetricsServiceRequest, max_points: int, now: float
) -> list[ScorePoint]:
    """Every health-score point as a ScorePoint (other metrics are ignored)."""
    decoded = decode_health(request)
    if decoded.rejected:
        raise RequestError(
            400,
            _reason(decoded.reasons, "invalid_metric"),
            f"{decoded.rejected} data points rejected, nothing stored: {decoded.error_message}",
        )
    if len(decoded.pushes) > max_points:
        raise RequestError(
            413,
            "too_many_records",
            f"{len(decoded.pushes)} score points in one request, the limit is {max_points}",
        )
    return [
        ScorePoint(
            cluster_id=p.cluster_id,
            node_id=p.node_id,
            ts=(t / 1e9) if t else now,
            score=p.score,
            job_id=p.job_id,
            host_name=p.host_name,
            gpu_model=p.gpu_model,
            gpu_count=p.gpu_count,
            provider=p.provider,
        )
        for p, t in decoded.timed()
    ]


def decode_body(
    body: bytes, content_type: str, kind: Signal, max_records: int, now: float
) -> Decoded:
    """A whole request body (``content_type`` one of the OTLP receiver core's media types),
    parsed and validated (events as rows received at ``now``); raises RequestError."""
    message = parse_body(body, content_type, REQUESTS[kind])
    if isinstance(message, ExportLogsServiceRequest):
        return Decoded(rows=[event_row(ev, now) for ev in logs_to_events(message, max_records)])
    assert isinstance(message, ExportMetricsServiceRequest)
    return Decoded(scores=metrics_to_scores(message, max_records, now))


def _ready() -> None:
    """Submitted once per worker at start, so workers spawn (and import) before traffic."""


def _exit_with(parent: int) -> None:
    """Worker initializer: exit once the daemon is gone. A worker holds both ends of the
    pool's pipes, so it would never see EOF and outlive a daemon that was SIGKILLed."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


_DEATHS_TO_GIVE_UP = 3  # worker deaths within _DEATH_WINDOW that end decoding in workers
_DEATH_WINDOW = 60.0


class DecodePool:
    """``workers`` processes running ``decode_body`` (0: it runs in this process, on a
    thread). A pool whose worker died is replaced, and the requests it held are answered
    "retry" (UnavailableError): none is lost. When workers keep dying (3 times in a minute:
    killed for memory, or a sandbox that forbids them), decoding goes on in this process,
    slower but never refused."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._lock = threading.Lock()
        self._deaths: list[float] = []
        self._pool: concurrent.futures.ProcessPoolExecutor | None = (
            self._start() if workers else None
        )

    def _start(self) -> concurrent.futures.ProcessPoolExecutor:
        # spawn, not fork: the daemon has threads (gRPC, the writer) a fork would copy stopped
        pool = concurrent.futures.ProcessPoolExecutor(
            self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_exit_with,
            initargs=(os.getpid(),),
        )
        for _ in range(self.workers):
            pool.submit(_ready)
        return pool

    async def decode(
        self, body: bytes, content_type: str, kind: Signal, max_records: int, now: float
    ) -> Decoded:
        pool = self._pool
        if pool is None:
            # Decoding a big batch takes milliseconds: off the event loop, so small requests
            # (health checks, other senders' replies) are not held up behind it.
            return await asyncio.to_thread(decode_body, body, content_type, kind, max_records, now)
        try:
            return await asyncio.wrap_future(
                pool.submit(decode_body, body, content_type, kind, max_records, now)
            )
        except BrokenProcessPool:
            raise self._replace(pool) from None

    def decode_sync(
        self, body: bytes, content_type: str, kind: Signal, max_records: int, now: float
    ) -> Decoded:
        pool = self._pool
        if pool is None:
            return decode_body(body, content_type, kind, max_records, now)
        try:
            return pool.submit(decode_body, body, content_type, kind, max_records, now).result()
        except BrokenProcessPool:
            raise self._replace(pool) from None

    def _replace(self, broken: concurrent.futures.ProcessPoolExecutor) -> UnavailableError:
        with self._lock:
            if self._pool is broken:  # the first request to notice replaces it
                broken.shutdown(wait=False, cancel_futures=True)
                now = time.monotonic()
                self._deaths = [t for t in self._deaths if now - t < _DEATH_WINDOW] + [now]
                if len(self._deaths) >= _DEATHS_TO_GIVE_UP:
                    log.error(
                        "decoding workers died %d times in %.0f s; decoding in this process"
                        " from now on",
                        len(self._deaths),
                        _DEATH_WINDOW,
                    )
                    self._pool = None
                else:
                    log.error("a decoding worker process died; starting a new pool")
                    self._pool = self._start()
        return UnavailableError("a decoding worker died; not stored, retry")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
