"""NCCL collectives and the clock offset, from a node DB through a real ``ingero fleet-push``
to a real ``ingero fleet``, over OTLP/HTTP and gRPC.

Fleet keeps no collectives yet that a test could read back, so a recording proxy sits
between fleet-push and Fleet: it decodes each push and passes it, and Fleet's reply with
its headers or initial metadata (``server_time`` among them), through unchanged. A thread
writes a tracer interval of two NCCL ranks into the node DB every interval, as ``ingero
trace`` does. Node and Fleet share this host's clock, so the pushed offset must be within
its uncertainty of 0. A skewed clock is made without any hook in the product: the proxy
adds 500 ms to Fleet's time on its way back, as a Fleet whose clock runs ahead would send.
The proxy also holds one push past the node's push timeout before it passes it on, as a
slow Fleet on a loaded host does: the node counts that push failed, Fleet gets it after the
next one, and the test reads the pushes in the order the node sent them.
"""

from __future__ import annotations

import http.client
import http.server
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from ingero.otlp.health import NodePush, decode_health
from tests.integration.push.cluster import Cluster, Procs, free_port, wait_for
from tests.nccl_db import nccl_node_db, rank_interval

pytestmark = pytest.mark.integration

INTERVAL = 1.0
COMM = "5a17c0ffee15900d"
CALLS = 200  # per rank and tracer interval
METRICS = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
LOGS = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"


@dataclass
class Recorder:
    """What passed the proxy: each health push, and Fleet's server time in its reply."""

    # (the push's time_unix_nano, the push): arrival order is not the node's order
    sent: list[tuple[int, NodePush]] = field(default_factory=list)
    server_times: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # The health push (1-based) held for ``hold_s`` before it is passed on (None: none),
    # past the node's push timeout (half its 1 s interval); how many passed so far.
    hold_at: int | None = None
    hold_s: float = 2.0
    arrived: int = 0
    held: int | None = None  # the held push's time_unix_nano, once it reached Fleet
    # Added to Fleet's server time on its way back: the node then reads a Fleet whose
    # clock is this far ahead of its own (the proxy is the test's, the product is untouched).
    shift: float = 0.0

    def shifted(self, name: str, value: str) -> str:
        if name.endswith("server-time") and value:
            return repr(float(value) + self.shift)
        return value

    def hold(self) -> bool:
        """Called as a health push arrives: sleeps if it is the one to hold."""
        with self.lock:
            self.arrived += 1
            held = self.arrived == self.hold_at
        if held:
            time.sleep(self.hold_s)
        return held

    def record(self, body: bytes, reply: dict[str, str], held: bool = False) -> None:
        decoded = decode_health(ExportMetricsServiceRequest.FromString(body))
        assert decoded.messages == [], decoded.messages
        with self.lock:
            self.sent += zip(decoded.times, decoded.pushes, strict=True)
            if held:
                (self.held,) = decoded.times
            if "server-time" in reply:
                self.server_times.append(float(reply["server-time"]))

    def snapshot(self) -> list[NodePush]:
        """The pushes that reached Fleet, in the order the node sent them."""
        with self.lock:
            return [push for _, push in sorted(self.sent, key=lambda sent: sent[0])]


def http_proxy(fleet_port: int, rec: Recorder) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            held = self.path == "/v1/metrics" and rec.hold()
            conn = http.client.HTTPConnection("127.0.0.1", fleet_port, timeout=10)
            keep = ("content-type", "content-encoding", "authorization")
            conn.request(
                "POST",
                self.path,
                body,
                {k: v for k, v in self.headers.items() if k.lower() in keep},
            )
            answer = conn.getresponse()
            data = answer.read()
            headers = {k.lower(): rec.shifted(k.lower(), v) for k, v in answer.getheaders()}
            conn.close()
            if self.path == "/v1/metrics" and answer.status == 200:
                rec.record(body, {k.removeprefix("x-ingero-"): v for k, v in headers.items()}, held)
            try:
                self.send_response(answer.status)
                for name, value in headers.items():
                    if name not in ("content-length", "connection", "date", "server"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the held push: the node stopped waiting for its answer

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def grpc_proxy(fleet_port: int, rec: Recorder) -> tuple[grpc.Server, int]:
    channel = grpc.insecure_channel(f"127.0.0.1:{fleet_port}")

    def forward(method: str) -> grpc.RpcMethodHandler:
        call_fleet = channel.unary_unary(method)  # raw bytes both ways

        def handle(body: bytes, context: grpc.ServicerContext) -> bytes:
            held = method == METRICS and rec.hold()
            reply, call = call_fleet.with_call(body, timeout=10)
            metadata = tuple((k, rec.shifted(k, str(v))) for k, v in call.initial_metadata())
            if method == METRICS:
                rec.record(body, {k.removeprefix("ingero-"): v for k, v in metadata}, held)
            context.send_initial_metadata(metadata)
            return bytes(reply)

        return grpc.unary_unary_rpc_method_handler(handle)

    handlers = {
        path.rsplit("/", 1)[0].lstrip("/"): grpc.method_handlers_generic_handler(
            path.rsplit("/", 1)[0].lstrip("/"), {"Export": forward(path)}
        )
        for path in (METRICS, LOGS)
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers(tuple(handlers.values()))
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, port


class Tracer(threading.Thread):
    """Writes one tracer interval of ranks 0 and 1 of COMM every INTERVAL, as ingero trace."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.stop = threading.Event()
        self.seq = 1

    def run(self) -> None:
        conn = nccl_node_db(self.path)
        try:
            while not self.stop.is_set():
                end = time.time()
                for rank in (0, 1):
                    rank_interval(
                        conn, end=end, pid=os.getpid(), comm_hash=COMM, comm_rank=rank,
                        nranks=2, first_seq=self.seq, count=CALLS, period=INTERVAL / CALLS,
                        lag=0.002 * rank,
                    )  # fmt: skip
                self.seq += CALLS
                self.stop.wait(INTERVAL)
        finally:
            conn.close()


def _both_ranks_sampled(push: NodePush) -> bool:
    return {comm.comm_rank for comm in push.collectives if comm.calls} == {0, 1}


def start(c: Cluster, transport: str, rec: Recorder) -> Callable[[], None]:
    """Fleet, the sink, a recording proxy in front of Fleet and fleet-push through it;
    returns what stops the proxy."""
    c.start_fleet()
    c.start_sink()
    if transport == "http":
        proxy = http_proxy(c.ports["otlp_http"], rec)
        c.start_push(0, transport, f"http://127.0.0.1:{proxy.server_address[1]}")
        return proxy.shutdown
    server, port = grpc_proxy(c.ports["otlp_grpc"], rec)
    c.start_push(0, transport, f"127.0.0.1:{port}")
    return lambda: server.stop(None)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    procs = Procs()
    c = Cluster(tmp_path, procs, INTERVAL, 1)
    try:
        yield c
    finally:
        procs.stop_all()


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_collectives_and_a_clock_offset_near_zero_reach_fleet(
    cluster: Cluster, transport: str
) -> None:
    c = cluster
    tracer = Tracer(c.tmp / f"{c.node(0)}.db")
    tracer.start()
    rec = Recorder(hold_at=5)
    close: Callable[[], None] = lambda: None  # noqa: E731
    try:
        close = start(c, transport, rec)
        with_clock = wait_for(
            lambda: [p for p in rec.snapshot() if p.clock and _both_ranks_sampled(p)][3:],
            60,
            "four pushes with both ranks' calls and a clock offset",
        )
        wait_for(lambda: rec.held, 30, "the held push to reach Fleet")
    finally:
        tracer.stop.set()
        tracer.join()
        if c.node(0) in c.pushers:
            Procs.stop(c.pushers[c.node(0)])
        close()
    assert c.fleet_metric("ingero_fleet_requests_total", transport=transport, signal="metrics") >= 4
    pushes = rec.snapshot()
    assert rec.server_times and all(p.node_id == c.node(0) for p in pushes)
    # Both ranks of the communicator, in every push that has them; sequence numbers only grow.
    seen: dict[int, list[int]] = {0: [], 1: []}
    top: dict[int, int | None] = {0: None, 1: None}  # the last call each rank sent so far
    for push in pushes:
        for comm in push.collectives:
            assert (comm.comm_hash, comm.nranks) == (COMM, 2)
            seen[comm.comm_rank].append(comm.entered_seq)
            seqs = [call.seq for call in comm.calls]
            assert seqs == sorted(seqs) and all(call.op == "ncclAllReduce" for call in comm.calls)
            if not seqs:
                continue
            # Each call is sent or counted dropped once: every call between a push's first
            # and last sampled ones is, and none before the rank's previous push ended
            # (a push lost on a loaded host leaves a gap, never a double count).
            assert len(seqs) + comm.dropped >= seqs[-1] - seqs[0] + 1
            before = top[comm.comm_rank]
            if before is not None:
                assert seqs[0] > before and len(seqs) + comm.dropped <= seqs[-1] - before
            top[comm.comm_rank] = seqs[-1]
    for rank in (0, 1):
        assert seen[rank] == sorted(seen[rank]) and seen[rank][-1] >= 2 * CALLS
    # Ranks of one node share their sampled sequence numbers in every push that carries
    # both, however the tracer's writes of the two fell between pushes. Rank 1 entered each
    # collective 2 ms after rank 0: the pushed entry times say so.
    for push in [p for p in pushes if _both_ranks_sampled(p)]:
        ranks = {comm.comm_rank: comm for comm in push.collectives}
        entered = {rank: {c.seq: c.entered_ns for c in ranks[rank].calls} for rank in (0, 1)}
        shared = entered[0].keys() & entered[1].keys()
        assert shared, (sorted(entered[0]), sorted(entered[1]))
        for seq in shared:
            assert entered[1][seq] - entered[0][seq] == pytest.approx(2_000_000, abs=1_000)
    # One clock, two processes: Fleet's time lies within the round trip, so the offset is
    # within its uncertainty of 0, and the uncertainty is a real (non-zero) half round trip.
    for push in with_clock:
        assert push.clock is not None
        assert 0 < push.clock.uncertainty_s < 1.0
        assert abs(push.clock.offset_s) <= push.clock.uncertainty_s + 1e-6
    assert not [e for e in c.events() if e.type == "clock_skew"]
    # Fleet took every point of every push: the communicators pass its decoder.
    assert c.fleet_metric("ingero_fleet_rejected_total") == 0


def test_a_clock_off_fleets_raises_clock_skew_on_every_channel_and_ends_it(
    cluster: Cluster,
) -> None:
    """Fleet's time reaches the node 500 ms ahead (through the proxy): the pushed offset
    says so within its uncertainty, clock_skew starts once, reaches the socket sink and
    Fleet (OTLP logs), and ends with the same event_id once the times agree again."""
    c = cluster
    rec = Recorder(shift=0.5)
    close = start(c, "http", rec)
    try:
        skewed = wait_for(
            lambda: [p for p in rec.snapshot() if p.clock][1:], 60, "two pushed offsets"
        )
        for push in skewed:
            assert push.clock is not None
            assert abs(push.clock.offset_s - 0.5) <= push.clock.uncertainty_s + 1e-6
        (start_event,) = wait_for(
            lambda: [e for e in c.events() if e.type == "clock_skew"], 30, "clock_skew start"
        )
        assert start_event.extra["state"] == "start" and start_event.node_id == c.node(0)
        assert start_event.extra["offset_ms"] == pytest.approx(
            500, abs=start_event.extra["uncertainty_ms"] + 0.001
        )
        rec.shift = 0.0  # the clocks agree again (a step: the old samples are dropped)
        events = wait_for(
            lambda: [e for e in c.events() if e.type == "clock_skew"][1:], 30, "clock_skew end"
        )
        # Fleet gets both through OTLP logs and passes them to its journal exit point.
        wait_for(
            lambda: c.fleet_metric("ingero_fleet_events_total", type="clock_skew") == 2,
            30,
            "Fleet to publish both clock_skew events",
        )
    finally:
        Procs.stop(c.pushers[c.node(0)])
        close()
    assert [e.extra["state"] for e in events] == ["end"]
    assert events[0].event_id == start_event.event_id
