"""Sustained ingest of ``ingero echo``: events/s acknowledged (= committed) over OTLP/HTTP.

Starts a real Echo on free loopback ports with a fresh database, then ``--senders`` threads
post pre-encoded OTLP/HTTP protobuf requests of ``--batch`` events each until ``--events``
events are acknowledged. Prints events/s and the per-request latency (p50/p99), and checks
the stored count. Usage: .venv/bin/python bench/echo_ingest.py [--events N] [--batch B]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from ingero.events import Event
from ingero.otlp.logs import encode_events


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """user+system CPU time of a process, from /proc (clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def hot_path(batch: int, kind: str) -> None:
    """CPU µs per event of each stage, in this process: decode+validate, then the commit."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    from ingero.echo.ingest import logs_to_events
    from ingero.echo.store import Store

    events = [
        Event(kind, f"node{i}", "c0", 1.7e9 + i, job_id="1", score=0.5, threshold=0.8)
        for i in range(batch)
    ]
    body = encode_events(events).SerializeToString()
    t = time.process_time()
    for _ in range(5):
        decoded = logs_to_events(ExportLogsServiceRequest.FromString(body), batch)
    decode = (time.process_time() - t) / (5 * batch)
    store = Store(Path(tempfile.mkdtemp(prefix="echo-hot-")) / "e.db")
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        for r in range(5):
            store.write(
                [
                    Event(
                        kind, e.node_id, "c0", e.timestamp + r, job_id="1", score=0.5, threshold=0.8
                    )
                    for e in decoded
                ]
            )
        wall = (time.perf_counter() - t0) / (5 * batch)
        cpu = (time.process_time() - c0) / (5 * batch)
    finally:
        store.close()
    print(
        f"hot path per event: decode+validate {decode * 1e6:.1f} µs CPU; "
        f"store commit {wall * 1e6:.1f} µs wall, {cpu * 1e6:.1f} µs CPU (process)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=2_000)
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--type", default="straggler_state", help="event type to send")
    args = parser.parse_args()
    hot_path(args.batch, args.type)

    work = Path(tempfile.mkdtemp(prefix="echo-bench-"))
    api, otlp = free_port(), free_port()
    config = {
        "db": str(work / "echo.db"),
        "listen": {
            "api": f"127.0.0.1:{api}",
            "otlp_http": f"127.0.0.1:{otlp}",
            "otlp_grpc": f"127.0.0.1:{free_port()}",
        },
        "limits": {"max_request_bytes": 64 * 1024**2},
        "retention": {"max_age": "30000d"},
    }
    (work / "echo.yaml").write_text(json.dumps(config))
    proc = subprocess.Popen(
        [sys.executable, "-m", "ingero.cli.main", "echo", "--config", str(work / "echo.yaml")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{api}/healthz", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        n_requests = args.events // args.batch
        bodies = []
        for r in range(n_requests):
            events = [
                Event(
                    args.type,
                    f"node{(r * args.batch + i) % 2000}",
                    f"c{i % 4}",
                    1.7e9 + r + i / args.batch,
                    job_id=str(r % 50),
                    score=0.5,
                    threshold=0.8,
                )
                for i in range(args.batch)
            ]
            bodies.append(encode_events(events).SerializeToString())
        latencies: list[float] = []
        failures: list[str] = []
        lock = threading.Lock()
        next_index = iter(range(n_requests))

        def sender() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", otlp, timeout=120)
            while True:
                with lock:
                    i = next(next_index, None)
                if i is None:
                    break
                t0 = time.perf_counter()
                conn.request(
                    "POST", "/v1/logs", bodies[i], {"Content-Type": "application/x-protobuf"}
                )
                response = conn.getresponse()
                response.read()
                if response.status != 200:
                    with lock:
                        failures.append(f"echo answered {response.status}")
                    break
                with lock:
                    latencies.append(time.perf_counter() - t0)
            conn.close()

        threads = [threading.Thread(target=sender) for _ in range(args.senders)]
        start = time.perf_counter()
        cpu_start = cpu_seconds(proc.pid)
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        server_cpu = cpu_seconds(proc.pid) - cpu_start
        if failures:
            raise SystemExit(f"{len(failures)} requests failed: {failures[0]}")
        total = n_requests * args.batch
        conn = sqlite3.connect(f"file:{work / 'echo.db'}?mode=ro", uri=True)
        stored = conn.execute("SELECT count(*) FROM events").fetchone()[0]
        conn.close()
        lat = sorted(latencies)
        print(f"events acknowledged: {total} in {elapsed:.2f}s -> {total / elapsed:,.0f} events/s")
        print(
            f"requests: {n_requests} x {args.batch} events, {args.senders} senders, "
            f"type {args.type}; latency p50 {statistics.median(lat) * 1e3:.0f} ms, "
            f"p99 {lat[int(len(lat) * 0.99) - 1] * 1e3:.0f} ms"
        )
        print(
            f"stored: {stored} (expected {total}); echo process CPU "
            f"{server_cpu / total * 1e6:.1f} µs per event "
            f"(= {total / server_cpu:,.0f} events per CPU-second)"
        )
        print(f"cpus: {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


if __name__ == "__main__":
    main()
