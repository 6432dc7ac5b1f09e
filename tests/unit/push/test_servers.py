"""Each inference server judged against its own baseline: a node serving several replicas
is as slow as its slowest one, a restarted server starts a new baseline, and the baselines
stay bounded however many servers come and go."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ingero.collectors.engines import MetricsError
from ingero.otlp.health import INFERENCE_STEP_RATE, INFERENCE_TOKEN_RATE
from ingero.push.engines import EngineWatcher
from ingero.push.sampler import NodeSample, NodeSampler
from ingero.push.servers import MAX_SERVERS, ServerBaselines, ServerStep, measure, slowest
from ingero.runtime.clock import ManualClock
from ingero.trace.aggregate import slot_of
from tests.unit.push.test_sampler import Node, sampler

MS = 1_000_000
DECODE_MS = 10.0  # a healthy replica's decode step
SERVERS = 8


def replicas(tmp_path: Path, clock: ManualClock, n: int = SERVERS) -> EngineWatcher:
    """``n`` vLLM servers (pids 100 + i), one per GPU, each with an engine-core child
    (pid 200 + i) that syncs the decode stream."""
    proc = tmp_path / "engines-proc"
    for i in range(n):
        for pid, ppid, argv in (
            (100 + i, 1, f"python3\0/v/bin/vllm\0serve\0llama\0--port\0{8000 + i}\0".encode()),
            (200 + i, 100 + i, b"python3\0-c\0from multiprocessing.spawn import spawn_main\0"),
        ):
            (proc / str(pid)).mkdir(parents=True)
            (proc / str(pid) / "cmdline").write_bytes(argv)
            (proc / str(pid) / "stat").write_text(f"{pid} (python3) S {ppid} {pid} 0 0\n")
    return EngineWatcher(
        db_path=tmp_path / "node.db", clock=clock, proc_root=proc, fetch=lambda *_: ""
    )


def stream_rows(
    now: float, slow: dict[int, float], handles: dict[int, str], rival: int | None = None
) -> list[dict]:  # type: ignore[type-arg]
    """One interval's decode stream rows of every server: 100 decode steps of DECODE_MS,
    times ``1 + slow[i]`` for server i; ``rival``: each server has a second stream too, with
    that many syncs of healthy steps."""
    rows = []
    for i in range(SERVERS):
        ms = DECODE_MS * (1.0 + slow.get(i, 0.0))
        streams = [(handles.get(i, f"00007f00c0de{i:04x}"), 100, ms)]
        if rival is not None:
            streams.append((f"00007f00feed{i:04x}", rival, DECODE_MS))
        rows.extend(
            {"ts_start": now - 2.0, "ts_end": now, "pid": 200 + i, "stream": stream,
             "syncs": n, "launches": 3 * n, "steps": n, "step_ns": int(n * ms * MS),
             "step_hist": json.dumps({str(slot_of(int(ms * MS))): n})}
            for stream, n, ms in streams
        )  # fmt: skip
    return rows


def sync(node: Node, counts: dict[int, int]) -> None:
    """One interval's stream syncs of each pid (pid → count), as the tracer counts them."""
    now = node.clock.now()
    with node.db.conn:
        node.db.table("intervals").insert_all(
            {"ts_start": now - 2.0, "ts_end": now, "pid": pid, "source": "cuda_runtime",
             "op": "cudaStreamSynchronize", "count": n, "total_ns": 10**6}
            for pid, n in counts.items()
        )  # fmt: skip


@dataclass
class Phase:
    samples: int
    slow: dict[int, float] = field(default_factory=dict)  # server index → slowdown
    handles: dict[int, str] = field(default_factory=dict)  # server index → a new stream
    # Each server's second stream, its syncs close to the decode stream's (95 and 105 by
    # turns): it takes the lead every other interval, by less than SWITCH_MARGIN.
    rival: bool = False


def run(tmp_path: Path, phases: list[Phase], peer: float | None = None) -> NodeSample:
    """Samples of a node serving SERVERS replicas, phase by phase; ``peer``: Fleet's peer
    median of ``inference_step_rate`` in the last sample (None: local mode)."""
    clock = ManualClock()
    node = Node(tmp_path, clock)
    s: NodeSampler = sampler(tmp_path, clock, engines=replicas(tmp_path, clock))
    sample = None
    total = sum(p.samples for p in phases)
    done = 0
    for phase in phases:
        for _ in range(phase.samples):
            node.run(2.0)
            now = clock.now()
            sync(node, {200 + i: 100 for i in range(SERVERS)})
            with node.db.conn:
                node.db.table("stream_intervals").insert_all(
                    stream_rows(
                        now, phase.slow, phase.handles, (95, 105)[done % 2] if phase.rival else None
                    )
                )
            done += 1
            peers = {INFERENCE_STEP_RATE: peer} if peer is not None and done == total else None
            sample = s.sample(peer_rates=peers)
    assert sample is not None and sample.result is not None
    assert len(s.servers.entries) <= SERVERS
    return sample


HEALTHY = 1e3 / DECODE_MS  # decode steps per second


@pytest.mark.parametrize(
    ("phases", "peer", "throughput", "slowest_pid"),
    [
        # Eight healthy replicas: each at its own baseline.
        ([Phase(8)], None, 1.0, None),
        # One replica of eight slowed 2x: the node is as slow as it (the median, 100/s
        # against a 100/s baseline, would read 1.0).
        ([Phase(6), Phase(3, slow={3: 1.0})], None, 0.5, 103),
        # Every replica slowed 2x.
        ([Phase(6), Phase(3, slow=dict.fromkeys(range(SERVERS), 1.0))], None, 0.5, None),
        # The slow replica's decode stream is new (it restarted): it starts a new baseline
        # and is neutral until that is warm; the others are judged.
        ([Phase(6), Phase(2, slow={3: 1.0}, handles={3: "00007f00beef0000"})], None, 1.0,
         None),
        # ... and once warm it is judged against its new (slow) baseline.
        ([Phase(6), Phase(5, slow={3: 1.0}, handles={3: "00007f00beef0000"})], None, 1.0,
         None),
        # Slow from birth: its own baseline is slow, so locally it is not seen ...
        ([Phase(8, slow={5: 1.0})], None, 1.0, None),
        # ... but against the peers' median it is: the slowest replica is the node's rate.
        ([Phase(8, slow={5: 1.0})], HEALTHY, 0.5, 105),
        # Healthy against the peers' median.
        ([Phase(8)], HEALTHY, 1.0, None),
        # A second stream that leads every other interval by a few syncs: each server keeps
        # its decode stream (and its baseline), so the slow one is still judged.
        ([Phase(6, rival=True), Phase(3, slow={3: 1.0}, rival=True)], None, 0.5, 103),
    ],
)  # fmt: skip
def test_the_node_is_as_slow_as_its_slowest_replica(
    tmp_path: Path, phases: list[Phase], peer: float | None, throughput: float,
    slowest_pid: int | None,
) -> None:  # fmt: skip
    sample = run(tmp_path, phases, peer)
    assert sample.result is not None
    assert sample.result.signals["throughput"] == pytest.approx(throughput, abs=0.03)
    # The pushed rate is still the median over the node's servers.
    rates = [HEALTHY / (1.0 + phases[-1].slow.get(i, 0.0)) for i in range(SERVERS)]
    assert sample.result.rates[INFERENCE_STEP_RATE] == pytest.approx(statistics.median(rates))
    if slowest_pid is not None:
        assert sample.slowest_server is not None
        assert sample.slowest_server.server == slowest_pid
        assert sample.result.rates["slowest_server_rate"] == pytest.approx(HEALTHY / 2)
    if peer is not None:
        assert sample.peer_rate == INFERENCE_STEP_RATE


def test_a_slow_replica_lowers_the_score_the_median_hid(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    healthy = run(tmp_path / "a", [Phase(9)])
    slow = run(tmp_path / "b", [Phase(6), Phase(3, slow={0: 1.0})])
    assert healthy.result is not None and slow.result is not None
    assert slow.result.score < healthy.result.score - 0.15


def step(server: int, rate: float, stream: str | None = "s") -> ServerStep:
    return ServerStep(server, (server + 1000, stream) if stream else None, rate)


@pytest.mark.parametrize(
    ("learned", "now", "ratios"),
    [
        # Not warm yet (2 samples of 3): neutral.
        ([[step(1, 100.0)]] * 2, [step(1, 50.0)], [None]),
        # Warm: judged against its own baseline.
        ([[step(1, 100.0)]] * 3, [step(1, 50.0)], [0.5]),
        # A new stream handle: a new baseline, neutral again.
        ([[step(1, 100.0)]] * 3, [step(1, 50.0, "t")], [None]),
        # No stream rows (syncs per second): judged against its own syncs per second ...
        ([[step(1, 100.0, None)]] * 3, [step(1, 50.0, None)], [0.5]),
        # ... a baseline apart from its decode stream's (another unit): neutral again.
        ([[step(1, 100.0)]] * 3, [step(1, 50.0, None)], [None]),
        # Each server its own baseline.
        ([[step(1, 100.0), step(2, 10.0)]] * 3, [step(1, 100.0), step(2, 5.0)], [1.0, 0.5]),
    ],
)  # fmt: skip
def test_judge_rule(
    learned: list[list[ServerStep]], now: list[ServerStep], ratios: list[float | None]
) -> None:
    b = ServerBaselines(alpha=0.3, alpha_down=0.02, warmup=3)
    for steps in learned:
        b.learn(b.judge(tuple(steps)))
    judged = b.judge(tuple(now))
    assert [s.ratio for s in judged] == [pytest.approx(r) if r else r for r in ratios]
    worst = slowest(judged)
    known = [(r, s.server) for r, s in zip(ratios, now, strict=True) if r is not None]
    assert (worst.server if worst else None) == (min(known)[1] if known else None)


def test_many_short_lived_servers_and_streams_stay_bounded() -> None:
    b = ServerBaselines(alpha=0.3, alpha_down=0.02, warmup=3)
    sizes = []
    for pid in range(10_000):
        live = range(max(0, pid - 3), pid + 1)  # each server lives four samples
        b.prune(live)
        b.learn(tuple(step(p, 100.0, f"{pid % 7}") for p in live))  # new streams too
        sizes.append(len(b.entries))
    assert max(sizes) == 4
    # Never told which are gone (no prune): the cap holds, the newest are kept.
    for pid in range(10_000):
        b.learn((step(pid, 100.0),))
        assert len(b.entries) <= MAX_SERVERS
    assert set(b.entries) == set(range(10_000 - MAX_SERVERS, 10_000))


def test_measure_takes_the_decode_stream_else_the_syncs() -> None:
    from ingero.nodedb.window import StreamWindow

    streams = {(11, "a"): StreamWindow(100, 300, 100, 100 * 10 * MS, {slot_of(10 * MS): 100})}
    got = measure(streams, {11: 100, 21: 50, 31: 0}, 2.0, {1: {1, 11}, 2: {2, 21}, 3: {3, 31}})
    assert got == (ServerStep(1, (11, "a"), pytest.approx(100.0)), ServerStep(2, None, 25.0))


@pytest.mark.parametrize(
    ("slow", "peer", "throughput"),
    [
        (None, None, 1.0),  # three healthy replicas
        (1, None, 0.5),  # one's per-token latency doubled: against its own baseline
        (1, 25.0, 0.5),  # ... and against the peers' median token rate
    ],
)
def test_a_slow_replica_by_its_own_metrics_token_rate(
    tmp_path: Path, slow: int | None, peer: float | None, throughput: float
) -> None:
    """Three vLLM servers whose /metrics say per-token latency (40 ms, 25 tokens/s): the
    node's token rate is their median, and the node is as slow as the slowest of them."""
    clock = ManualClock()
    node = Node(tmp_path, clock)
    proc = tmp_path / "engines-proc"
    for i in range(3):
        (proc / str(100 + i)).mkdir(parents=True)
        argv = f"python3\0/v/bin/vllm\0serve\0llama\0--port\0{8000 + i}\0"
        (proc / str(100 + i) / "cmdline").write_bytes(argv.encode())
    served: dict[str, float] = {}
    latency: dict[str, float] = {}

    def fetch(url: str, timeout_s: float, max_bytes: int) -> str:
        served[url] = served.get(url, 0.0) + 1000.0
        # Cumulative: each interval's 1000 tokens at the current latency.
        latency[url] = latency.get(url, 0.0) + 1000.0 * lag.get(url, 0.04)
        return (
            "# TYPE vllm:inter_token_latency_seconds histogram\n"
            f"vllm:inter_token_latency_seconds_sum {latency[url]}\n"
            f"vllm:inter_token_latency_seconds_count {served[url]}\n"
        )

    lag: dict[str, float] = {}
    engines = EngineWatcher(db_path=tmp_path / "node.db", clock=clock, proc_root=proc, fetch=fetch)
    s = sampler(tmp_path, clock, engines=engines)
    for _ in range(7):
        node.run(2.0)
        s.sample()
    if slow is not None:
        lag[f"http://127.0.0.1:{8000 + slow}/metrics"] = 0.08
    node.run(2.0)
    s.sample()  # the reading that spans the change
    node.run(2.0)
    sample = s.sample(peer_rates={INFERENCE_TOKEN_RATE: peer} if peer else None)
    assert sample.result is not None
    assert sample.result.rates[INFERENCE_TOKEN_RATE] == pytest.approx(25.0)  # the median
    assert sample.result.signals["throughput"] == pytest.approx(throughput, abs=0.03)
    if slow is not None:
        assert sample.slowest_server is not None and sample.slowest_server.server == 100 + slow


TIMED = {
    # Steps the servers' own /metrics time (cumulative seconds and count of forward steps).
    "tgi": (
        "text-generation-launcher\0--model-id\0llama\0--port\0{port}\0",
        "# TYPE tgi_batch_forward_duration histogram\n"
        'tgi_batch_forward_duration_sum{{method="decode"}} {total}\n'
        'tgi_batch_forward_duration_count{{method="decode"}} {count}\n',
    ),
    "triton": (
        "tritonserver\0--model-repository\0/models/llama\0--metrics-port\0{port}\0",
        "# TYPE nv_inference_compute_infer_duration_us counter\n"
        'nv_inference_compute_infer_duration_us{{model="llama",version="1"}} {total_us}\n'
        "# TYPE nv_inference_exec_count counter\n"
        'nv_inference_exec_count{{model="llama",version="1"}} {count}\n',
    ),
}


class Timed:
    """Four servers of ``engine`` (pids 100 to 103) whose /metrics time their forward steps:
    1000 steps an interval, each DECODE_MS (``lag``: by URL, another step time; ``down``:
    every read fails)."""

    def __init__(self, tmp_path: Path, clock: ManualClock, engine: str) -> None:
        proc = tmp_path / "engines-proc"
        argv, self.text = TIMED[engine]
        for pid in range(100, 104):
            (proc / str(pid)).mkdir(parents=True)
            (proc / str(pid) / "cmdline").write_bytes(argv.format(port=7900 + pid).encode())
            (proc / str(pid) / "stat").write_text(f"{pid} (server) S 1 {pid} 0 0\n")
        self.count: dict[str, float] = {}
        self.total: dict[str, float] = {}
        self.lag: dict[str, float] = {}
        self.down = False
        self.engines = EngineWatcher(
            db_path=tmp_path / "node.db", clock=clock, proc_root=proc, fetch=self.fetch
        )

    def slow(self, pid: int) -> None:
        self.lag[f"http://127.0.0.1:{7900 + pid}/metrics"] = 2 * DECODE_MS / 1e3

    def fetch(self, url: str, timeout_s: float, max_bytes: int) -> str:
        if self.down:
            raise MetricsError(f"{url}: connection refused")
        # Cumulative: each interval's 1000 steps at the current step time.
        self.count[url] = self.count.get(url, 0.0) + 1000.0
        self.total[url] = self.total.get(url, 0.0) + 1000.0 * self.lag.get(url, DECODE_MS / 1e3)
        total = self.total[url]
        return self.text.format(total=total, total_us=total * 1e6, count=self.count[url])


@pytest.mark.parametrize("engine", sorted(TIMED))
@pytest.mark.parametrize(
    ("slow", "peer", "throughput"),
    [
        (None, None, 1.0),  # four healthy replicas
        (102, None, 0.5),  # one's steps take twice as long: against its own baseline
        (102, HEALTHY, 0.5),  # ... and against the peers' median step rate
    ],
)
def test_a_slow_replica_by_the_steps_its_own_metrics_time(
    tmp_path: Path, engine: str, slow: int | None, peer: float | None, throughput: float
) -> None:
    """Four TGI (or Triton) servers whose /metrics time their forward steps (10 ms, 100
    steps a second): the node's step rate is their median, and the node is as slow as the
    slowest of them (the median of four hides one slow replica)."""
    clock = ManualClock()
    node = Node(tmp_path, clock)
    servers = Timed(tmp_path, clock, engine)
    s = sampler(tmp_path, clock, engines=servers.engines)
    for _ in range(7):
        node.run(2.0)
        s.sample()
    if slow is not None:
        servers.slow(slow)
    node.run(2.0)
    s.sample()  # the reading that spans the change
    node.run(2.0)
    sample = s.sample(peer_rates={INFERENCE_STEP_RATE: peer} if peer else None)
    assert sample.result is not None
    assert sample.result.rates[INFERENCE_STEP_RATE] == pytest.approx(HEALTHY)  # the median
    assert sample.result.signals["throughput"] == pytest.approx(throughput, abs=0.03)
    if slow is not None:
        assert sample.slowest_server is not None and sample.slowest_server.server == slow
        assert sample.result.rates["slowest_server_rate"] == pytest.approx(HEALTHY / 2)


def test_a_missed_metrics_reading_keeps_the_servers_step_baselines(tmp_path: Path) -> None:
    """Four TGI servers that also sync (the tracer sees them): one push whose /metrics
    reads all fail falls back to the tracer's steps for two samples, and the servers'
    /metrics step baselines are still warm after it, so a slow replica is judged at once."""
    clock = ManualClock()
    node = Node(tmp_path, clock)
    servers = Timed(tmp_path, clock, "tgi")
    s = sampler(tmp_path, clock, engines=servers.engines)
    sample = None
    for n in range(10):
        servers.down = n == 7
        if n == 9:
            servers.slow(102)
        node.run(2.0)
        sync(node, dict.fromkeys(range(100, 104), 100))
        sample = s.sample()
        if n == 8:  # no /metrics step rate since the failed reads: the tracer's syncs stood in
            assert sorted(s.servers.entries) == [100, 101, 102, 103]
            assert {e.stream for e in s.servers.entries.values()} == {None}
    assert sample is not None and sample.result is not None
    assert sample.result.signals["throughput"] == pytest.approx(0.5, abs=0.03)
    assert sample.slowest_server is not None and sample.slowest_server.server == 102


@pytest.mark.parametrize(
    ("slow", "peer", "throughput"),
    [
        (None, None, 1.0),  # four healthy replicas
        (2, None, 0.5),  # one syncs half as often: against its own syncs per second
        (2, 50.0, 0.5),  # ... and against the peers' median
    ],
)
def test_a_slow_replica_by_its_syncs_per_second(
    tmp_path: Path, slow: int | None, peer: float | None, throughput: float
) -> None:
    """Four servers whose syncs name no stream (no stream_intervals rows: an older tracer,
    launches on no named stream): each steps at its tree's syncs per second, judged against
    a baseline of its own, so one slow replica of four shows though their median does not
    move."""
    clock = ManualClock()
    node = Node(tmp_path, clock)
    s = sampler(tmp_path, clock, engines=replicas(tmp_path, clock, n=4))
    sample = None
    for n in range(10):
        node.run(2.0)
        sync(node, {200 + i: 50 if n >= 8 and i == slow else 100 for i in range(4)})
        sample = s.sample(peer_rates={INFERENCE_STEP_RATE: peer} if peer and n == 9 else None)
    assert sample is not None and sample.result is not None and sample.window is not None
    rate = 100 / sample.window.covered_s
    assert sample.result.rates[INFERENCE_STEP_RATE] == pytest.approx(rate)  # the median
    assert sample.result.signals["throughput"] == pytest.approx(throughput, abs=0.03)
    if slow is not None:
        assert sample.slowest_server is not None and sample.slowest_server.server == 100 + slow
        assert sample.slowest_server.stream is None


def test_a_decode_stream_holds_its_lead_against_a_close_second() -> None:
    """Two streams of one server with close sync counts that trade the lead window by
    window: the server keeps its first decode stream, so its baseline warms and judges;
    a stream with clearly more syncs (past SWITCH_MARGIN) takes over."""
    from ingero.nodedb.window import StreamWindow

    def window(a: int, b: int) -> dict[tuple[int, str], StreamWindow]:
        return {
            (11, key): StreamWindow(n, 3 * n, n, n * 10 * MS, {slot_of(10 * MS): n})
            for key, n in (("a", a), ("b", b))
        }

    b = ServerBaselines(alpha=0.3, alpha_down=0.02, warmup=3)
    tree = {1: {1, 11}}
    judged: tuple[ServerStep, ...] = ()
    for i in range(8):
        close = window(100, 105) if i % 2 else window(105, 100)
        judged = b.judge(measure(close, {11: 205}, 2.0, tree, b.streams()))
        b.learn(judged)
    assert [s.stream for s in judged] == [(11, "a")]
    assert judged[0].ratio == pytest.approx(1.0)
    judged = b.judge(measure(window(100, 130), {11: 230}, 2.0, tree, b.streams()))
    assert [s.stream for s in judged] == [(11, "b")] and judged[0].ratio is None
    # A stream the server no longer syncs gives way at once.
    assert measure(window(0, 5), {11: 5}, 2.0, tree, {1: (11, "a")})[0].stream == (11, "b")
