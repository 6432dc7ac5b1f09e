"""Push throughput of ``ingero fleet`` over OTLP/HTTP and OTLP/gRPC, beside no-op servers.

Run: ``.venv/bin/python -m bench.fleet_push`` (``--duration 3`` to shorten).

Simulated agents (distinct node ids, 64 per Slurm job) push one health request each over
keep-alive connections from separate client processes. Two phases per server:
``max``   every connection pushes back to back (capacity; the ratio to the no-op server);
``paced`` the agents push at ``--agents``/``--interval`` per second in total (latency at the
          target rate; latency is measured from the scheduled send time, so a server that
          falls behind shows it).
The no-op servers answer every request with an empty 200 / empty OTLP response on the same
transport stack (the asyncio HTTP server, grpcio), so the ratio is what Fleet's decode,
ingest and reply cost on top of the transport; ``--stdlib`` adds a no-op
``http.server.ThreadingHTTPServer`` (why Fleet has its own HTTP server). CPU s/1k pushes is the server process's
user+system time. On gRPC, ``noop-grpc-meta`` also sends three pairs of initial metadata,
as Fleet's reply does (grpcio sends them in a batch of their own): what the threshold in
the reply costs on the transport. ``bench.fleet_compare`` puts Fleet beside the no-op and
the previous release in one run, with every feature on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ingero.fleet.httpserver import HttpRequest, HttpResponse

ROOT = Path(__file__).resolve().parents[1]
METRICS_PATH = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"


def agent_bodies(first: int, count: int) -> list[bytes]:
    from ingero.otlp.health import NodePush, encode_health

    now = time.time_ns()
    return [
        encode_health(
            NodePush(
                node_id=f"node{i:06d}",
                cluster_id="bench",
                score=0.85 + (i % 10) / 100,
                job_id=str(i // 64),
                rank=i % 64,
                world_size=64,
                signals={"throughput": 0.9, "compute": 0.8, "memory": 0.95, "cpu": 0.9},
            ),
            now,
        ).SerializeToString()
        for i in range(first, first + count)
    ]


def http_request(host: str, port: int, body: bytes, token: str | None = None) -> bytes:
    authorization = f"Authorization: Bearer {token}\r\n" if token else ""
    head = (
        f"POST /v1/metrics HTTP/1.1\r\nHost: {host}:{port}\r\n{authorization}"
        f"Content-Type: application/x-protobuf\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _http_conn(
    host: str, port: int, reqs: list[bytes], rate: float | None, stop_at: float, out: list[float]
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    loop = asyncio.get_running_loop()
    start = loop.time()
    k = 0
    while True:
        scheduled = start + k / rate if rate else loop.time()
        if scheduled >= stop_at:
            break
        delay = scheduled - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        writer.write(reqs[k % len(reqs)])
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.split(b"Content-Length: ", 1)[1].split(b"\r\n", 1)[0])
        if length:
            await reader.readexactly(length)
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(head.decode(errors="replace"))
        out.append(loop.time() - scheduled)
        k += 1
    writer.close()


async def _grpc_conn(
    address: str, bodies: list[bytes], rate: float | None, stop_at: float, out: list[float]
) -> None:
    import grpc

    loop = asyncio.get_running_loop()
    async with grpc.aio.insecure_channel(address) as channel:
        export = channel.unary_unary(METRICS_PATH)  # bytes in, bytes out
        start = loop.time()
        k = 0
        while True:
            scheduled = start + k / rate if rate else loop.time()
            if scheduled >= stop_at:
                break
            delay = scheduled - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await export(bodies[k % len(bodies)], timeout=10)
            out.append(loop.time() - scheduled)
            k += 1


def client(args: dict[str, Any], index: int, queue: mp.Queue[Any]) -> None:
    """One client process: its share of agents over its share of connections."""

    async def main() -> tuple[list[float], float]:
        per = args["agents"] // args["clients"]
        # another benchmark's pushes (a function like agent_bodies) and bearer token, if any
        bodies = args.get("make_bodies", agent_bodies)(index * per, per)
        conns = args["connections"]
        rate = args["rate"] / args["clients"] / conns if args["rate"] else None
        latencies: list[list[float]] = [[] for _ in range(conns)]
        loop = asyncio.get_running_loop()
        stop_at = loop.time() + args["duration"]
        if args["transport"] == "http":
            host, port = args["address"].rsplit(":", 1)
            reqs = [http_request(host, int(port), b, args.get("token")) for b in bodies]
            jobs = [
                _http_conn(host, int(port), reqs[c::conns], rate, stop_at, latencies[c])
                for c in range(conns)
            ]
        else:
            jobs = [
                _grpc_conn(args["address"], bodies[c::conns], rate, stop_at, latencies[c])
                for c in range(conns)
            ]
        started = time.perf_counter()
        await asyncio.gather(*jobs)
        return [x for lat in latencies for x in lat], time.perf_counter() - started

    queue.put(asyncio.run(main()))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(server_pid: int, args: dict[str, Any]) -> dict[str, float]:
    ctx = mp.get_context("fork")
    queue: mp.Queue[Any] = ctx.Queue()
    procs = [ctx.Process(target=client, args=(args, i, queue)) for i in range(args["clients"])]
    cpu0 = cpu_seconds(server_pid)
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    cpu = cpu_seconds(server_pid) - cpu0
    latencies = np.concatenate([np.asarray(lat) for lat, _ in results])
    # Pushes over the time the clients ran (a late server stretches it past --duration).
    elapsed = max(seconds for _, seconds in results)
    for p in procs:
        p.join()
    n = latencies.size
    return {
        "pushes": n,
        "rate": n / elapsed,
        "p50_ms": float(np.percentile(latencies, 50) * 1e3),
        "p99_ms": float(np.percentile(latencies, 99) * 1e3),
        "cpu_per_1k": cpu / n * 1000,
    }


def start_server(kind: str, tmp: Path) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    ready = tmp / f"{kind}.json"
    ready.unlink(missing_ok=True)
    if kind == "fleet":
        cmd = [
            sys.executable, "-m", "ingero.cli.main", "fleet", "--otlp-grpc", "127.0.0.1:0",
            "--otlp-http", "127.0.0.1:0", "--api", "127.0.0.1:0", "--push-interval", "5s",
            "--max-nodes", "1000000", "--log-level", "warning", "--ready-file", str(ready),
        ]  # fmt: skip
    else:
        cmd = [
            sys.executable,
            "-m",
            "bench.fleet_push",
            "--serve",
            kind,
            "--ready-file",
            str(ready),
        ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "INGERO_CONFIG": ""})
    deadline = time.monotonic() + 30
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{kind} server did not start")
        time.sleep(0.05)
    return proc, json.loads(ready.read_text())


NOOP_METADATA = (
    ("ingero-threshold", "0.7"),
    ("ingero-quorum-met", "true"),
    ("ingero-panic", "false"),
)


def _noop_handler() -> Callable[[HttpRequest], HttpResponse]:
    """Answers an empty 200: the transport alone."""
    from ingero.fleet.httpserver import HttpResponse

    return lambda _r: HttpResponse(200, b"", "x")


def _parse_handler() -> Callable[[HttpRequest], HttpResponse]:
    """Parses the body (upb) and reads nothing of it, then answers as the no-op."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )

    from ingero.fleet.httpserver import HttpResponse

    def handle(request: HttpRequest) -> HttpResponse:
        ExportMetricsServiceRequest.FromString(request.body)
        return HttpResponse(200, b"", "x")

    return handle


def _read_handler() -> Callable[[HttpRequest], HttpResponse]:
    """Parses the body and reads what Fleet reads of it (``decode_health`` as its receiver
    calls it), then answers as the no-op: no token, no state, no threshold in the reply.
    What any server on this stack that looks at the push pays at least."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )

    from ingero.fleet.httpserver import HttpResponse
    from ingero.otlp.health import decode_health

    def handle(request: HttpRequest) -> HttpResponse:
        decode_health(
            ExportMetricsServiceRequest.FromString(request.body), details=False, rates=True
        )
        return HttpResponse(200, b"", "x")

    return handle


# The servers on Fleet's own HTTP stack that do less than Fleet: the no-op, and two floors.
FLOORS: dict[str, Callable[[], Callable[[HttpRequest], HttpResponse]]] = {
    "noop-http": _noop_handler,
    "parse-http": _parse_handler,
    "read-http": _read_handler,
}


def serve_noop(kind: str, ready_file: str) -> None:
    """A server that does nothing per request, on the same stack as Fleet's receiver."""
    stop = False

    def on_term(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    if kind == "noop-stdlib":
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Noop(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, like the other servers

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Noop)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        bound = {"otlp_http": f"127.0.0.1:{httpd.server_address[1]}"}
    elif kind in FLOORS:
        from ingero.fleet.config import LimitsConfig
        from ingero.fleet.httpserver import HttpServer

        server = HttpServer(
            "noop",
            "127.0.0.1",
            0,
            FLOORS[kind](),
            head_timeout=float(LimitsConfig().head_timeout),
        )
        bound = {"otlp_http": f"127.0.0.1:{server.start()}"}
    else:
        from concurrent.futures import ThreadPoolExecutor

        import grpc

        def answer(_request: bytes, context: grpc.ServicerContext) -> bytes:
            if kind == "noop-grpc-meta":
                # What Fleet's reply adds on the transport: the threshold in the initial
                # metadata, which grpcio sends in a batch of its own.
                context.send_initial_metadata(NOOP_METADATA)
            return b""

        gserver = grpc.server(ThreadPoolExecutor(max_workers=8))
        gserver.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    METRICS_PATH.split("/")[1],
                    {"Export": grpc.unary_unary_rpc_method_handler(answer)},
                ),
            )
        )
        port = gserver.add_insecure_port("127.0.0.1:0")
        gserver.start()
        bound = {"otlp_grpc": f"127.0.0.1:{port}"}
    Path(ready_file).write_text(json.dumps(bound))
    while not stop:
        time.sleep(0.2)


def hot_path(n: int) -> None:
    """CPU microseconds per push of each stage of the OTLP/HTTP hot path, in this process;
    with a token: the gate (keyring of 1,000 tokens, per-token rate limit, audit counter)."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )

    from ingero.fleet.config import FleetConfig, LimitsConfig
    from ingero.fleet.daemon import FleetDaemon
    from ingero.fleet.httpserver import _parse_head, render
    from ingero.fleet.otlp_http import OtlpHttpHandler
    from ingero.otlp.health import decode_health
    from ingero.runtime.journald import JournalWriter
    from ingero.security.access import Gate
    from ingero.security.audit import AuditLog
    from ingero.security.bearer import Keyring, NamedToken, digest
    from ingero.security.ratelimit import RateLimitConfig

    bodies = agent_bodies(0, n)
    daemon = FleetDaemon(FleetConfig(limits=LimitsConfig(max_nodes=10 * n)))
    open_gate = Gate(Keyring([]), None, RateLimitConfig())
    handler = OtlpHttpHandler(daemon.receiver, daemon.metrics, open_gate, 1 << 22)
    token = "bench-token-0123456789abcdef"
    ring = Keyring(
        [NamedToken(f"t{i}", digest(f"other-token-{i}"), None) for i in range(999)]
        + [NamedToken("bench", digest(token), None)]
    )
    # the limit's arithmetic runs on every push; a limit this high never refuses one
    limits = RateLimitConfig(per_token=1e12, token_burst=10**12)
    audit = AuditLog("fleet", writer=JournalWriter("/nonexistent/journal"))
    gate = Gate(ring, None, limits, audit)
    secured = OtlpHttpHandler(daemon.receiver, daemon.metrics, gate, 1 << 22)
    head = http_request("127.0.0.1", 4318, b"").split(b"\r\n\r\n")[0]
    token_head = head + f"\r\nAuthorization: Bearer {token}".encode()
    parse = ExportMetricsServiceRequest.FromString

    def whole(handler: OtlpHttpHandler, head: bytes) -> Callable[[], None]:
        def run() -> None:
            for body in bodies:
                request, length, _ = _parse_head(head)
                request.peer = "127.0.0.1"
                request.body = body
                assert handler.gate(request, length) is None
                render(handler(request), True)

        return run

    whole(handler, head)()  # every node known, as in steady state
    daemon.state.tick()
    requests = [parse(b) for b in bodies]
    pushes = [decode_health(r, details=False).pushes[0] for r in requests]
    authz = f"Bearer {token}"
    stages = {
        "HTTP head parse": lambda: [_parse_head(head) for _ in bodies],
        "protobuf parse": lambda: [parse(b) for b in bodies],
        "decode + validate": lambda: [decode_health(r, details=False) for r in requests],
        "FleetState.ingest": lambda: [daemon.state.ingest(p) for p in pushes],
        "gate, no token": lambda: [open_gate.admit("otlp-http", None, "h", "") for _ in bodies],
        "gate, token": lambda: [gate.admit("otlp-http", authz, "h", "") for _ in bodies],
        "whole, no token": whole(handler, head),
        "whole, token": whole(secured, token_head),
    }
    print(f"# hot path, CPU us per push (best of 5 x {n:,} pushes, no sockets)")
    for name, stage in stages.items():
        best = float("inf")
        for _ in range(5):
            start = time.process_time()
            stage()
            best = min(best, time.process_time() - start)
        print(f"{name:<20}{best / n * 1e6:>8.1f}")
    audit.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=25_000)
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between pushes")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--clients", type=int, default=2, help="client processes")
    parser.add_argument("--connections", type=int, default=16, help="connections per client")
    parser.add_argument("--transports", default="http,grpc")
    parser.add_argument(
        "--stdlib", action="store_true", help="also a no-op http.server.ThreadingHTTPServer"
    )
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--ready-file", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.serve:
        serve_noop(opts.serve, opts.ready_file)
        return
    hot_path(20_000)
    target = opts.agents / opts.interval
    print(
        f"# {opts.agents} agents every {opts.interval:g}s (target {target:,.0f} pushes/s), "
        f"{opts.clients} client processes x {opts.connections} connections, "
        f"{opts.duration:g}s per phase, {os.cpu_count()} CPUs"
    )
    print(f"{'server':<16}{'transport':<10}{'phase':<7}{'pushes/s':>10}{'p50 ms':>9}"
          f"{'p99 ms':>9}{'CPU s/1k':>10}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for transport in opts.transports.split(","):
            best: dict[str, float] = {}
            kinds = ["fleet", f"noop-{transport}"]
            if transport == "http" and opts.stdlib:
                kinds.append("noop-stdlib")
            if transport == "grpc":
                kinds.append("noop-grpc-meta")
            for kind in kinds:
                proc, bound = start_server(kind, Path(tmp))
                address = bound["otlp_http" if transport == "http" else "otlp_grpc"]
                try:
                    phases = [("max", 0.0)] + ([("paced", target)] if kind == "fleet" else [])
                    for phase, rate in phases:
                        result = measure(
                            proc.pid,
                            {
                                "agents": opts.agents,
                                "clients": opts.clients,
                                "connections": opts.connections,
                                "duration": opts.duration,
                                "transport": transport,
                                "address": address,
                                "rate": rate,
                            },
                        )
                        if phase == "max":
                            best[kind] = result["rate"]
                        print(
                            f"{kind:<16}{transport:<10}{phase:<7}{result['rate']:>10,.0f}"
                            f"{result['p50_ms']:>9.2f}{result['p99_ms']:>9.2f}"
                            f"{result['cpu_per_1k']:>10.3f}"
                        )
                finally:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(timeout=30)
            ratio = best["fleet"] / best[f"noop-{transport}"]
            print(f"fleet/no-op {transport} max-rate ratio: {ratio:.2f}")


if __name__ == "__main__":
    main()
