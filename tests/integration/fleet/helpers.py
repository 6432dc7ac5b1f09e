"""Start the real ``ingero fleet`` as a subprocess and talk to it like a node would."""

from __future__ import annotations

import gzip
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from prometheus_client.parser import text_string_to_metric_families

from ingero.fleet.config import ThresholdConfig
from ingero.otlp.health import NodePush, encode_health
from ingero.otlp.logs import encode_events
from ingero.schema.events import Event

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[3]


def wait_for(predicate: Callable[[], T], timeout: float = 60.0, what: str = "condition") -> T:
    """Poll until ``predicate()`` is truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last value {value!r}")
        time.sleep(0.05)


def expected_threshold(
    scores: Iterable[float], k: float = 2.0, min_margin: float = ThresholdConfig().min_margin
) -> float:
    """DESIGN.md's raw threshold, computed independently with the statistics module."""
    values = list(scores)
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    return med - max(k * 1.4826 * mad, min_margin)


def health_request(pushes: Iterable[NodePush]) -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    for push in pushes:
        request.resource_metrics.extend(encode_health(push, time.time_ns()).resource_metrics)
    return request


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Fleet:
    """A running fleet: a subprocess, or (``proc`` None) a FleetDaemon in this process."""

    proc: subprocess.Popen[bytes] | None
    otlp_grpc: str
    otlp_http: str
    api: str
    log_path: Path | None = None
    token: str | None = None
    ssl_context: Any = None
    extra_headers: dict[str, str] = field(default_factory=dict)

    def _conn(self, address: str) -> http.client.HTTPConnection:
        host, _, port = address.rpartition(":")
        if self.ssl_context is not None:
            return http.client.HTTPSConnection(
                "localhost", int(port), timeout=10, context=self.ssl_context
            )
        return http.client.HTTPConnection(host, int(port), timeout=10)

    def request(
        self,
        address: str,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        conn = self._conn(address)
        try:
            all_headers = dict(self.extra_headers)
            if self.token:
                all_headers["Authorization"] = f"Bearer {self.token}"
            all_headers.update(headers or {})
            conn.request(method, path, body=body, headers=all_headers)
            resp = conn.getresponse()
            return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
        finally:
            conn.close()

    def push(self, pushes: Iterable[NodePush], encoding: str = "protobuf") -> Reply:
        request = health_request(pushes)
        if encoding == "json":
            from ingero.otlp.values import to_json

            return self.post_metrics(to_json(request), "application/json")
        body = request.SerializeToString()
        if encoding == "gzip":
            return self.post_metrics(
                gzip.compress(body), "application/x-protobuf", {"Content-Encoding": "gzip"}
            )
        return self.post_metrics(body, "application/x-protobuf")

    def post_metrics(
        self, body: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> Reply:
        return self.request(
            self.otlp_http,
            "POST",
            "/v1/metrics",
            body,
            {"Content-Type": content_type, **(headers or {})},
        )

    def post_logs(self, events: Iterable[Event]) -> Reply:
        """Events as one OTLP/HTTP logs request, the way fleet-push sends them."""
        return self.request(
            self.otlp_http,
            "POST",
            "/v1/logs",
            encode_events(list(events)).SerializeToString(),
            {"Content-Type": "application/x-protobuf"},
        )

    def threshold(self, cluster_id: str, job_id: str | None = None, **more: str) -> Reply:
        query = f"cluster_id={cluster_id}" + (f"&job_id={job_id}" if job_id else "")
        query += "".join(f"&{k}={v}" for k, v in more.items())
        return self.request(self.api, "GET", f"/api/v1/threshold?{query}")

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """/metrics parsed with prometheus-client's own parser: {(sample, labels): value}."""
        reply = self.request(self.api, "GET", "/metrics")
        assert reply.status == 200, reply
        out = {}
        for family in text_string_to_metric_families(reply.body.decode()):
            for sample in family.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return out

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels`` (0 when none)."""
        return sum(
            value
            for (sample, sample_labels), value in self.metrics().items()
            if sample == name and set(labels.items()) <= set(sample_labels)
        )

    def log(self) -> str:
        assert self.log_path is not None
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
        return self.proc.returncode


def start_fleet(
    tmp: Path,
    config: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    token: str | None = None,
    ssl_context: Any = None,
) -> Fleet:
    """Run ``ingero fleet`` on free loopback ports; returns once the ready file exists."""
    cfg: dict[str, Any] = {
        "listen": {
            "otlp_grpc": "127.0.0.1:0",
            "otlp_http": "127.0.0.1:0",
            "api": "127.0.0.1:0",
        },
        "push_interval": "0.2s",
        "ttl_multiplier": 1000,
        "threshold": {"ema_alpha": 1.0},
    }
    for key, value in (config or {}).items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    config_path = tmp / "fleet.yaml"
    config_path.write_text(yaml.safe_dump(cfg))
    ready = tmp / "ready.json"
    log_path = tmp / "fleet.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ingero.cli.main",
                "fleet",
                "--config",
                str(config_path),
                "--ready-file",
                str(ready),
            ],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    try:
        wait_for(lambda: ready.exists() or proc.poll() is not None, 30, "fleet to start")
        if not ready.exists():
            raise AssertionError(f"fleet exited {proc.returncode}: {log_path.read_text()}")
        bound = json.loads(ready.read_text())
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return Fleet(
        proc, bound["otlp_grpc"], bound["otlp_http"], bound["api"], log_path, token, ssl_context
    )
