"""The inference servers of this node, each push interval: recognised from /proc, recorded in
the node DB's ``engines`` table, measured from their own /metrics.

fleet-push owns this (not the tracer): it knows the configured service name that groups
replicas, and it already runs once per interval next to the node DB. Fail-open: a server
whose /metrics is garbage, huge or hanging costs at most one bounded read, is logged once per
cause, and leaves the node's other figures as they are.
"""

from __future__ import annotations

import logging
import sqlite3
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ingero.collectors import engines as ce
from ingero.nodedb.writer import ENGINES_SCHEMA, NoEnginesTable, record_engines
from ingero.otlp.health import INFERENCE_STEP_RATE, INFERENCE_TOKEN_RATE
from ingero.runtime.clock import Clock

log = logging.getLogger(__name__)

# Per-process state is kept for at most this many servers (a node runs a handful).
MAX_ENGINES = 64
# The node DB keeps the rows of this many servers, the most recently seen (servers that
# exited included, so a query can say what served here): bounded however often pids churn.
MAX_ENGINE_ROWS = 256
# One push's /metrics reads, together, take at most this many read timeouts.
SERVERS_PER_BUDGET = 2

Fetcher = Callable[[str, float, int], str]


@dataclass
class _Seen:
    source: ce.Engine  # as the command line says
    engine: ce.Engine  # and as its /metrics adds (the model, Triton's TensorRT-LLM backend)
    first_seen: float
    reading: ce.Reading | None = None
    read_at: float | None = None


class EngineWatcher:
    """Keeps the node's inference servers between samples; :meth:`observe` once per push."""

    def __init__(
        self,
        *,
        db_path: Path,
        clock: Clock,
        service: str | None = None,
        proc_root: Path = Path("/proc"),
        timeout_s: float = 1.0,
        max_bytes: int = ce.MAX_METRICS_BYTES,
        fetch: Fetcher = ce.fetch,
    ) -> None:
        self.db_path = db_path
        self.clock = clock
        self.configured = service
        self.scanner = ce.Scanner(proc_root)
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.fetch = fetch
        self.seen: dict[int, _Seen] = {}
        self.logged: set[str] = set()  # each cause once, not once a push
        self.rates: dict[int, ce.Rates] = {}  # each server's last interval
        # The node's Slurm job and rank, set by the push agent each interval (for the rows).
        self.tags: tuple[str | None, int | None] = (None, None)
        self.turn = 0  # where this push's /metrics reads start (see observe)

    @property
    def service(self) -> str | None:
        """The configured service name, else the one model every server here serves."""
        if self.configured:
            return self.configured
        models = {engine.model for engine in self.serving().values()}
        return models.pop() if len(models) == 1 else None

    def observe(self) -> dict[str, float]:
        """Scan, record and measure; the node's inference rates for this interval."""
        now = self.clock.now()
        job_id, rank = self.tags
        found = {e.pid: e for e in self.scanner.scan() if e.pid is not None}
        for pid in [p for p in self.seen if p not in found]:
            del self.seen[pid]
            self.rates.pop(pid, None)
        for pid, engine in sorted(found.items())[:MAX_ENGINES]:
            seen = self.seen.get(pid)
            if seen is None or seen.source != engine:
                self.seen[pid] = _Seen(engine, engine, now)
        # Several hanging servers must not cost one timeout each: all reads of a push
        # share SERVERS_PER_BUDGET timeouts; the servers left over wait for the next push,
        # where the reads start one server further on (none is left out every time).
        deadline = self.clock.monotonic() + SERVERS_PER_BUDGET * self.timeout_s
        servers = list(ce.unique([s.engine for s in self.seen.values()]))
        if servers:
            turn = self.turn % len(servers)
            servers = servers[turn:] + servers[:turn]
            self.turn += 1
        for engine in servers:
            if engine.metrics_url is None or engine.pid is None:
                continue
            if self.clock.monotonic() >= deadline:
                self._once("inference servers: /metrics reads took their budget; the rest wait")
                self.seen[engine.pid].reading = None
                self.rates.pop(engine.pid, None)
                continue
            self._measure(self.seen[engine.pid], now)
        self._record(now, job_id, rank)
        return self._node_rates()

    def _measure(self, seen: _Seen, now: float) -> None:
        url, pid = seen.engine.metrics_url, seen.engine.pid
        assert url is not None and pid is not None
        try:
            text = self.fetch(url, self.timeout_s, self.max_bytes)
            reading = ce.parse(text, seen.engine.engine)
        except ce.MetricsError as exc:
            self._once(f"inference server pid {seen.engine.pid} ({seen.engine.engine}): {exc}")
            seen.reading = None  # the next good reading starts a new interval
            self.rates.pop(pid, None)
            return
        if reading.trtllm and seen.engine.engine == "triton":
            seen.engine = ce.Engine(
                "trtllm", seen.engine.model, seen.engine.role, url, seen.engine.pid
            )
        if seen.engine.model is None and reading.model:
            seen.engine = ce.Engine(
                seen.engine.engine, reading.model, seen.engine.role, url, seen.engine.pid
            )
        if seen.reading is not None and seen.read_at is not None:
            self.rates[pid] = ce.rates(seen.reading, reading, now - seen.read_at)
        seen.reading, seen.read_at = reading, now

    def _node_rates(self) -> dict[str, float]:
        """The median over the node's servers (a node serving one model has one or a few)."""
        out: dict[str, float] = {}
        for name, values in (
            (INFERENCE_TOKEN_RATE, [r.token_rate for r in self.rates.values()]),
            (INFERENCE_STEP_RATE, [r.step_rate for r in self.rates.values()]),
        ):
            measured = [v for v in values if v is not None]
            if measured:
                out[name] = statistics.median(measured)
        return out

    def _record(self, now: float, job_id: str | None, rank: int | None) -> None:
        """One ``engines`` row per server, refreshed; rows of gone servers stay (their
        ``last_seen`` says when), the newest MAX_ENGINE_ROWS of them."""
        if not self.seen:
            return
        service = self.service
        rows = [
            (
                pid,
                s.engine.engine,
                s.engine.model,
                s.engine.role,
                service,
                s.engine.metrics_url,
                job_id,
                rank,
                s.first_seen,
                now,
            )
            for pid, s in self.seen.items()
        ]
        try:
            record_engines(self.db_path, rows, MAX_ENGINE_ROWS)
        except NoEnginesTable as exc:
            self._once(
                f"{self.db_path}: node DB version {exc.version} has no engines table "
                f"(version {ENGINES_SCHEMA}); inference servers are not recorded"
            )
        except sqlite3.Error as exc:
            self._once(f"cannot record inference servers in {self.db_path}: {exc}")

    def _once(self, message: str) -> None:
        if message not in self.logged and len(self.logged) < 256:
            self.logged.add(message)
            log.warning("%s", message)

    def serving(self) -> dict[int, ce.Engine]:
        """The servers that serve a model, by pid: routers aside (they only pass requests
        on to the servers)."""
        return {pid: s.engine for pid, s in self.seen.items() if s.engine.role != "router"}

    def trees(self) -> dict[int, frozenset[int]]:
        """Each serving server with its worker processes, by the server's pid."""
        return {pid: self.scanner.tree(pid) for pid in self.serving()}

    def summary(self) -> Mapping[int, ce.Engine]:
        return {pid: s.engine for pid, s in self.seen.items()}
