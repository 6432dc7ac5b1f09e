"""Sustained ingest of ``ingero echo``: events/s acknowledged (= committed) over OTLP/HTTP.

Starts a real Echo on free loopback ports with a fresh database, then ``--senders`` threads
post pre-encoded OTLP/HTTP protobuf requests of ``--batch`` events each until ``--events``
events are acknowledged. Prints events/s and the per-request latency (p50/p99), and checks
the stored count. The default stream is straggler events as Fleet emits them
(``episode_stream``). Usage:
.venv/bin/python bench/echo_ingest.py [--events N] [--batch B] [--type episodes|<event type>]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
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
import uuid
from pathlib import Path
from typing import Any

from ingero.otlp.logs import encode_events
from ingero.schema.events import Event


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> tuple[float, float]:
    """user+system CPU seconds of a process and of its live children (the decoding
    workers), from /proc."""
    own = children = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        ticks = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        if stat.parent.name == str(pid):
            own += ticks
        elif fields[1] == str(pid):
            children += ticks
    return own, children


def hot_path(batch: int, kind: str) -> None:
    """CPU µs per event of each stage, in this process: decode+validate (what a decoding
    worker does), then the commit of the decoded rows."""
    from ingero.echo.decoding import decode_body
    from ingero.echo.store import Store
    from ingero.otlp.transport import PROTOBUF

    bodies = [
        encode_events(
            Event(kind, f"node{i}", "c0", 1.7e9 + r + i, job_id="1", score=0.5, threshold=0.8)
            for i in range(batch)
        ).SerializeToString()
        for r in range(5)
    ]
    t = time.process_time()
    decoded = [decode_body(body, PROTOBUF, "logs", batch, time.time()) for body in bodies]
    decode = (time.process_time() - t) / (5 * batch)
    work = Path(tempfile.mkdtemp(prefix="echo-hot-"))
    store = Store(work / "e.db")
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        for d in decoded:
            store.submit(rows=d.rows).result()
        wall = (time.perf_counter() - t0) / (5 * batch)
        cpu = (time.process_time() - c0) / (5 * batch)
    finally:
        store.close()
        shutil.rmtree(work)
    print(
        f"hot path per event: decode+validate {decode * 1e6:.1f} µs CPU; "
        f"store commit {wall * 1e6:.1f} µs wall, {cpu * 1e6:.1f} µs CPU (process)"
    )


REEMIT = 60.0  # seconds between an episode's straggler_state events


def episode_stream(count: int, seed: int = 1) -> list[Event]:
    """Straggler events as Fleet emits them, in time order: 10,000 nodes (4 clusters, jobs
    of 100 nodes), 500 of them in an episode at any time; each episode is a
    ``straggler_state``, 3-30 re-emits a minute apart (fleet-push's default: every 12
    intervals of 5 s), then its ``straggler_resolved``, all with the episode's one
    ``event_id``; 5% of episodes also drain their node. A new episode starts on another
    node as one ends."""
    rng = random.Random(seed)
    nodes = [(f"c{n % 4}", f"c{n % 4}-n{n:05d}", str(n // 100)) for n in range(10_000)]
    free = list(range(len(nodes)))
    rng.shuffle(free)
    # per episode: node index, event id, re-emits left, next time it emits
    live: list[list[Any]] = []
    t = 1.7e9
    events: list[Event] = []

    def start(at: float) -> None:
        n = free.pop()
        live.append([n, str(uuid.uuid4()), rng.randint(3, 30), at + REEMIT])
        cluster, node, job = nodes[n]
        events.append(
            Event(
                "straggler_state",
                node,
                cluster,
                at,
                event_id=live[-1][1],
                job_id=job,
                score=0.4 + 0.3 * rng.random(),
                threshold=0.8,
            )
        )
        if rng.random() < 0.05:
            events.append(
                Event(
                    "node_drained",
                    node,
                    cluster,
                    at,
                    job_id=job,
                    extra={"reason": "ingero: straggler", "backend": "scontrol"},
                )
            )

    for _ in range(500):
        start(t + REEMIT * rng.random())
    while len(events) < count:
        live.sort(key=lambda e: e[3])
        episode = live[0]
        n, event_id, left, t = episode
        cluster, node, job = nodes[n]
        if left:
            events.append(
                Event(
                    "straggler_state",
                    node,
                    cluster,
                    t,
                    event_id=event_id,
                    job_id=job,
                    score=0.4 + 0.3 * rng.random(),
                    threshold=0.8,
                )
            )
            episode[2], episode[3] = left - 1, t + REEMIT
        else:
            events.append(
                Event(
                    "straggler_resolved",
                    node,
                    cluster,
                    t,
                    event_id=event_id,
                    job_id=job,
                    score=0.9,
                    threshold=0.8,
                    extra={"reason": "recovered"},
                )
            )
            live.pop(0)
            free.insert(rng.randrange(len(free) + 1), n)
            start(t + 10.0 * rng.random())
    return events[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=2_000)
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument(
        "--type",
        default="episodes",
        help="'episodes' (episode_stream), or one event type to send to 2,000 nodes x 50 jobs"
        " (straggler_state: the worst case, every event a different episode)",
    )
    args = parser.parse_args()
    hot_path(args.batch, "straggler_state" if args.type == "episodes" else args.type)

    work = Path(tempfile.mkdtemp(prefix="echo-bench-"))
    api, otlp = free_port(), free_port()
    config = {
        "db": str(work / "echo.db"),
        "listen": {
            "api": f"127.0.0.1:{api}",
            "otlp_http": f"127.0.0.1:{otlp}",
            "otlp_grpc": f"127.0.0.1:{free_port()}",
        },
        "limits": {"max_body_bytes": 64 * 1024**2},
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
        if args.type == "episodes":
            stream = episode_stream(n_requests * args.batch)
            batches = [stream[r * args.batch : (r + 1) * args.batch] for r in range(n_requests)]
        else:
            batches = [
                [
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
                for r in range(n_requests)
            ]
        bodies = [encode_events(events).SerializeToString() for events in batches]
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
        own_start, children_start = cpu_seconds(proc.pid)
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        own_end, children_end = cpu_seconds(proc.pid)
        own_cpu, children_cpu = own_end - own_start, children_end - children_start
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
            f"stored: {stored} (expected {total}); CPU per event: echo process "
            f"{own_cpu / total * 1e6:.1f} µs + decoding workers {children_cpu / total * 1e6:.1f} µs"
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{api}/api/v1/status", timeout=10) as r:
            store_stats = json.load(r)["store"]
        print(
            f"commits: {store_stats['commits']}, "
            f"{store_stats['events_stored'] / max(1, store_stats['commits']):,.0f} events each"
        )
        print(f"cpus: {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        shutil.rmtree(work)  # a run leaves ~0.5 GB per million events; left, they slow the next


if __name__ == "__main__":
    main()
