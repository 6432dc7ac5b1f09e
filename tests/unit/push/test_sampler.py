"""The sampler end to end on a node DB the synthetic generator wrote, driven by a manual clock."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from ingero.collectors.gpu import GpuStatus, interpret
from ingero.collectors.procfs import ProcReader
from ingero.nodedb.schema import connect
from ingero.otlp.health import INFERENCE_STEP_RATE, INFERENCE_TOKEN_RATE
from ingero.push.engines import EngineWatcher
from ingero.push.sampler import NodeSampler
from ingero.push.score import ScoreConfig
from ingero.runtime.clock import ManualClock
from ingero.workload.generator import WorkloadGenerator, WorkloadProfile

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "collectors"


class FixedGpu:
    def __init__(self, status: GpuStatus) -> None:
        self.status = status
        self.queries = 0

    def query(self) -> GpuStatus:
        self.queries += 1
        return self.status


class Node:
    """A node DB fed by the generator, one interval per clock step."""

    def __init__(
        self,
        tmp_path: Path,
        clock: ManualClock,
        seed: int = 1,
        gpu_rows: bool = True,
        tracer: bool = True,
        shape: str = "gpu-bound",
    ) -> None:
        self.path = tmp_path / "node.db"
        self.db = connect(self.path)
        self.gen = WorkloadGenerator(WorkloadProfile(shape=shape, noise=0.01), seed=seed)
        self.clock = clock
        self.gpu_rows = gpu_rows  # False: a node where nothing samples NVML
        self.tracer = tracer  # False: no tracer rows, GPU rows only (ingero gpu-sample)

    def run(
        self,
        seconds: float,
        slowdown: float = 0.0,
        step: float = 0.5,
        stalled: bool = False,
        **gpu: object,
    ) -> None:
        """``gpu`` overrides columns of the GPU rows (to inject a hardware problem)."""
        for _ in range(round(seconds / step)):
            start = self.clock.now()
            self.clock.advance(step)
            rows = self.gen.tick(start, self.clock.now(), slowdown, stalled)
            with self.db.conn:
                if self.tracer:
                    self.db.table("intervals").insert_all(rows.intervals)
                    self.db.table("host_intervals").insert_all(rows.host_intervals)
                if self.gpu_rows:
                    self.db.table("gpu_intervals").insert_all(
                        [{**row, **gpu} for row in rows.gpu_intervals]
                    )
                    self.db.table("gpu_processes").insert_all(rows.gpu_processes)


def sampler(tmp_path: Path, clock: ManualClock, **kwargs: object) -> NodeSampler:
    proc = tmp_path / "proc"
    if not proc.exists():
        shutil.copytree(FIXTURES / "proc-t0", proc)
        # Plenty of host memory, so the workload's own signals decide the dominant one.
        (proc / "meminfo").write_text("MemTotal: 1000 kB\nMemAvailable: 900 kB\n")
    return NodeSampler(
        node_id="n1",
        db_path=tmp_path / "node.db",
        config=ScoreConfig(warmup_samples=3, idle_after=2),
        window_s=2.0,
        clock=clock,
        baseline_path=tmp_path / "baseline.json",
        proc=ProcReader(proc),
        **kwargs,  # type: ignore[arg-type]
    )


def test_calibrates_scores_detects_slowdown_and_restart_skips_warmup(tmp_path: Path) -> None:
    clock = ManualClock()
    node = Node(tmp_path, clock)
    s = sampler(tmp_path, clock)
    states = []
    for _ in range(5):
        node.run(2.0)
        sample = s.sample()
        states.append(sample.state)
    assert states[:2] == ["calibrating", "calibrating"]
    assert states[2:] == ["active"] * 3
    healthy = sample.result
    assert healthy is not None
    assert healthy.signals["throughput"] == pytest.approx(1.0, abs=0.05)
    # Driver-API launches are the throughput; no step source is "unknown", not a rate of 0.
    assert healthy.rates["kernel_launch_rate"] == pytest.approx(3_484.0, rel=0.05)
    assert "step_rate" not in healthy.rates
    # GPU busy from NVML rows, relative to the node's own baseline: healthy reads ~1.
    assert healthy.rates["gpu_busy_fraction"] == pytest.approx(0.98, abs=0.02)
    assert healthy.signals["compute"] == pytest.approx(1.0, abs=0.03)
    # The fixture's /proc/stat never moves, so host CPU is not measured.
    assert healthy.signals["gpu_health"] == 1.0 and healthy.missing_signals == ("cpu",)
    assert healthy.score >= 0.85

    node.run(2.0, slowdown=0.3)
    slow = s.sample()
    assert slow.result is not None
    assert slow.result.signals["throughput"] == pytest.approx(0.7, abs=0.05)
    assert slow.result.signals["compute"] == pytest.approx(0.7, abs=0.05)
    assert slow.result.dominant_signal == "throughput"
    assert slow.score < healthy.score - 0.1

    restarted = sampler(tmp_path, clock)
    assert restarted.restore_reason is None
    node.run(2.0)
    again = restarted.sample()
    assert again.state == "active"
    assert again.result is not None
    assert again.result.signals["throughput"] == pytest.approx(1.0, abs=0.05)


def test_idle_then_stale_then_recovery(tmp_path: Path) -> None:
    clock = ManualClock()
    node = Node(tmp_path, clock)
    s = sampler(tmp_path, clock, pid_alive=lambda pid: False)
    for _ in range(3):
        node.run(2.0)
        s.sample()
    clock.advance(10)  # the workload stopped writing, and its process is gone
    quiet = s.sample()
    # Its job has ended: idle at once, not after idle_after quiet samples scored as active.
    assert quiet.state == "idle" and quiet.transition is not None
    assert quiet.job_running is False and not quiet.stalled
    node.path.rename(tmp_path / "moved.db")
    stale = s.sample()
    assert stale.state == "stale" and stale.result is None and stale.score == 0.0
    assert stale.stale_reason is not None and "does not exist" in stale.stale_reason
    (tmp_path / "moved.db").rename(node.path)
    node.run(2.0)
    assert s.sample().state == "active"


def test_a_stalled_process_keeps_the_node_active_stalled_and_scored_until_it_exits(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    node = Node(tmp_path, clock)
    alive = {4242}  # the generator's process id
    s = sampler(tmp_path, clock, pid_alive=lambda pid: pid in alive)
    for _ in range(4):
        node.run(2.0)
        healthy = s.sample()
    assert healthy.state == "active" and not healthy.stalled
    # Stopped, not gone (SIGSTOP, a hang): the tracer still writes its intervals, and they
    # hold no calls from it (no GPU rows either here).
    node.gpu_rows = False
    node.run(2.0, stalled=True)
    stalled = s.sample()
    assert stalled.state == "active" and stalled.stalled and stalled.job_running is True
    assert stalled.result is not None and not stalled.held
    # Its launch rate is measured, and it is 0: throughput 0, far below a healthy score.
    assert stalled.result.rates["kernel_launch_rate"] == 0.0
    assert stalled.result.signals["throughput"] == 0.0
    assert stalled.score < healthy.score - 0.4
    clock.advance(2.0)  # the tracer wrote nothing new: no data, the stall is kept
    held = s.sample()
    assert held.held and held.stalled and held.score == stalled.score
    node.run(2.0, stalled=True)
    assert s.sample().stalled  # still stalled, never idle while the process lives
    alive.clear()  # the job ends
    node.run(2.0, stalled=True)
    ended = s.sample()
    assert ended.state == "idle" and not ended.stalled and ended.job_running is False


def test_a_job_file_alone_says_the_job_runs_when_no_process_was_seen(tmp_path: Path) -> None:
    clock = ManualClock()
    node = Node(tmp_path, clock, gpu_rows=False)  # the tracer runs, nothing was ever traced
    s = sampler(tmp_path, clock)
    s.state.work_samples = 3  # warmed up, as after a restart
    s.state.state = "active"
    node.run(2.0, stalled=True)
    assert s.sample(job_file=True).stalled
    node.run(2.0, stalled=True)
    gone = s.sample(job_file=False)
    assert not gone.stalled and gone.job_running is None  # nothing tells: idle_after rules


def test_a_silent_tracer_goes_stale_not_stalled_and_comes_back(tmp_path: Path) -> None:
    clock = ManualClock()
    node = Node(tmp_path, clock)
    s = sampler(tmp_path, clock, pid_alive=lambda pid: True)
    for _ in range(4):
        node.run(2.0)
        s.sample()
    held = []
    for _ in range(10):  # 20 s without a row: past stale_after (15 s)
        clock.advance(2.0)
        sample = s.sample()
        assert not sample.stalled
        held.append(sample.held)
        if sample.state == "stale":
            break
    assert held[:-1] == [True] * (len(held) - 1) and sample.state == "stale"
    assert sample.stale_reason is not None and "tracer wrote nothing" in sample.stale_reason
    assert sample.result is None and sample.transition is not None
    node.run(2.0)
    back = s.sample()
    assert back.state == "active" and not back.held and back.result is not None


# (tracer interval, push interval, the most the tracer writes a row late, push jitter)
CADENCES = [
    # Equal intervals, the pushes in phase with the tracer's writes, which come 0-10 ms
    # late: half the pushes find no new row (what 48 real nodes on 2 cores did).
    (1.0, 1.0, 0.01, 0.0),
    (1.0, 1.0, 0.3, 0.1),
    (0.5, 1.0, 0.02, 0.1),  # the tracer twice as often
    (1.0, 5.0, 0.02, 0.1),  # the defaults: 5 tracer intervals per push
    (2.0, 1.0, 0.02, 0.1),  # the tracer half as often: every other push finds nothing
    (5.0, 1.0, 0.02, 0.1),
]


def cadence_run(
    tmp_path: Path, tracer: float, push: float, late: float, jitter: float, stall_at: float
) -> list[tuple[float, bool, bool, float | None]]:
    """Writes a healthy workload's rows every ``tracer`` s, each up to ``late`` s after its
    interval ends (stalled from ``stall_at``), samples every ``push`` s ± ``jitter``,
    starting ``late / 2`` after a write; returns (time, stalled, held, throughput signal)
    per sample of the active node."""
    clock = ManualClock()
    node = Node(tmp_path, clock)
    s = NodeSampler(
        node_id="n1",
        db_path=node.path,
        config=ScoreConfig(warmup_samples=3, idle_after=2),
        window_s=push,
        clock=clock,
        proc=ProcReader(FIXTURES / "proc-t0"),
        pid_alive=lambda pid: True,
    )
    rng = random.Random(7)
    t0 = clock.now()
    writes = [t0 + k * tracer for k in range(1, int(60 / tracer) + 1)]
    out = []
    pushes, t = [], t0 + late / 2
    while t < t0 + 60:
        t += push * (1 + rng.uniform(-jitter, jitter))
        pushes.append(t)
    events = sorted(
        [(w + rng.uniform(0, late), "write", w) for w in writes] + [(p, "push", p) for p in pushes]
    )
    for at, kind, end in events:
        clock.advance(at - clock.now())
        if kind == "write":
            rows = node.gen.tick(end - tracer, end, 0.0, end - t0 > stall_at)
            with node.db.conn:
                node.db.table("intervals").insert_all(rows.intervals)
                node.db.table("host_intervals").insert_all(rows.host_intervals)
                node.db.table("gpu_intervals").insert_all(rows.gpu_intervals)
                node.db.table("gpu_processes").insert_all(rows.gpu_processes)
        else:
            sample = s.sample()
            signal = sample.result.signals.get("throughput") if sample.result else None
            if sample.state == "active":
                out.append((at - t0, sample.stalled, sample.held, signal))
    return out


@pytest.mark.parametrize(("tracer", "push", "late", "jitter"), CADENCES)
def test_late_rows_and_windows_without_data_are_never_a_stall(
    tmp_path: Path, tracer: float, push: float, late: float, jitter: float
) -> None:
    samples = cadence_run(tmp_path, tracer, push, late, jitter, stall_at=1e9)
    assert len(samples) > 5
    assert not any(stalled for _, stalled, _, _ in samples)
    # Rates are per covered time: a late row neither halves one window nor doubles the next.
    signals = [x for _, _, held, x in samples if not held and x is not None]
    assert min(signals) > 0.9, signals
    if push <= tracer:
        assert any(held for _, _, held, _ in samples)  # windows without data happened


@pytest.mark.parametrize(("tracer", "push", "late", "jitter"), CADENCES)
def test_a_real_stall_is_still_flagged_at_any_cadence(
    tmp_path: Path, tracer: float, push: float, late: float, jitter: float
) -> None:
    samples = cadence_run(tmp_path, tracer, push, late, jitter, stall_at=30.0)
    before = [stalled for at, stalled, _, _ in samples if at < 30.0]
    after = [(at, stalled) for at, stalled, _, _ in samples if at >= 30.0]
    assert before and not any(before)
    first = next(at for at, stalled in after if stalled)
    # Two quiet tracer intervals must be written, and then read by a push whose window
    # holds no launches (with 5 tracer intervals per push, the second after the stall).
    assert first <= 30.0 + 2 * tracer + late + 2.2 * push + 1e-6
    assert all(stalled for at, stalled in after if at >= first)


def test_throughput_against_the_peers_median_sees_a_node_slow_from_birth(tmp_path: Path) -> None:
    clock = ManualClock()
    node = Node(tmp_path, clock)
    s = sampler(tmp_path, clock)
    for _ in range(5):
        node.run(2.0, slowdown=0.25)
        alone = s.sample()
    assert alone.result is not None and alone.peer_rate is None
    # Its own baseline learnt the slow rate: alone it looks healthy.
    assert alone.result.signals["throughput"] == pytest.approx(1.0, abs=0.05)
    node.run(2.0, slowdown=0.25)
    peers = s.sample(peer_rates={"kernel_launch_rate": 3_484.0, "step_rate": 10.0})
    assert peers.result is not None
    # No step source on this node: the launch rate is compared (step_rate is not pushed).
    assert peers.peer_rate == "kernel_launch_rate"
    assert peers.result.signals["throughput"] == pytest.approx(0.75, abs=0.05)
    assert peers.result.rates["throughput_peer_median"] == 3_484.0
    assert peers.score < alone.score - 0.08


def test_gpu_rows_in_the_node_db_come_before_a_live_query(tmp_path: Path) -> None:
    clock = ManualClock()
    node = Node(tmp_path, clock)
    gpu = FixedGpu(interpret(0, (FIXTURES / "nvidia-smi" / "h100x2.txt").read_text(), ""))
    s = sampler(tmp_path, clock, gpu=gpu)
    node.run(2.0, busy_ns=210_000_000)  # 42% of each 0.5 s row
    result = s.sample().result
    assert result is not None
    assert result.rates["gpu_busy_fraction"] == pytest.approx(0.42)  # the rows', not nvidia-smi's
    assert gpu.queries == 0


def test_live_gpu_query_where_no_gpu_rows_are_written(tmp_path: Path) -> None:
    clock = ManualClock()
    node = Node(tmp_path, clock, gpu_rows=False)
    gpu = FixedGpu(interpret(0, (FIXTURES / "nvidia-smi" / "h100x2.txt").read_text(), ""))
    s = sampler(tmp_path, clock, gpu=gpu)
    node.run(2.0)
    result = s.sample().result
    assert result is not None
    assert result.rates["gpu_busy_fraction"] == pytest.approx((97 + 100) / 200)
    assert gpu.queries == 1
    # nvidia-smi says nothing of hardware health: missing, not healthy.
    assert result.missing_signals == ("cpu", "gpu_health")
    host = sampler(tmp_path / "other", clock)
    assert host.gpu.query().error is not None


def test_unmeasured_gpu_busy_is_missing_and_never_the_sync_estimate(tmp_path: Path) -> None:
    clock = ManualClock()
    node = Node(tmp_path, clock, gpu_rows=False)
    s = sampler(tmp_path, clock)  # no GPU query answers either
    node.run(2.0)
    sample = s.sample()
    assert sample.result is not None and sample.window is not None
    assert sample.window.sync_busy_estimate is not None  # the tracer saw syncs ...
    assert "compute" in sample.result.missing_signals  # ... but they are not GPU busy
    assert "gpu_busy_fraction" not in sample.result.rates
    assert sample.gpu_error is not None


def test_a_throttling_gpu_degrades_the_score_and_raises_one_finding(tmp_path: Path) -> None:
    clock = ManualClock()
    node = Node(tmp_path, clock)
    s = sampler(tmp_path, clock)
    for _ in range(4):
        node.run(2.0)
        healthy = s.sample()
    node.run(2.0, throttle_reasons=0x40, sm_clock_mhz=1300)  # hw thermal slowdown
    hot = s.sample()
    assert hot.result is not None and healthy.result is not None
    assert hot.result.signals["gpu_health"] == pytest.approx(0.8)
    assert hot.score == pytest.approx(healthy.score * 0.8, rel=0.03)
    assert [f.type for f in hot.gpu_findings] == ["gpu_throttle"]
    node.run(2.0, throttle_reasons=0x40)
    assert s.sample().gpu_findings == ()
    node.run(2.0, xid_count=1, xids="[79]")
    xid = s.sample()
    assert [f.type for f in xid.gpu_findings] == ["gpu_xid", "gpu_throttle"]
    assert xid.result is not None and xid.result.signals["gpu_health"] == 0.5


def test_quarantined_baseline_means_warmup_again(tmp_path: Path) -> None:
    clock = ManualClock()
    (tmp_path / "baseline.json").write_text("{broken")
    Node(tmp_path, clock).run(2.0)
    s = sampler(tmp_path, clock)
    assert s.restore_reason is not None and s.restore_reason.startswith("corrupt")
    assert s.sample().state == "calibrating"
    assert list(tmp_path.glob("baseline.json.quarantined.*"))


def test_broken_proc_files_leave_those_signals_out(tmp_path: Path) -> None:
    clock = ManualClock()
    node = Node(tmp_path, clock, gpu_rows=False)
    s = sampler(tmp_path, clock)
    (tmp_path / "proc" / "stat").write_text("garbage\n")
    node.run(2.0)
    result = s.sample().result
    assert result is not None
    assert result.missing_signals == ("compute", "cpu", "gpu_health")
    assert result.signals["memory"] == pytest.approx(0.9)
    (tmp_path / "proc" / "meminfo").unlink()
    node.run(2.0)
    result = s.sample().result
    assert result is not None
    assert result.missing_signals == ("compute", "memory", "cpu", "gpu_health")
    assert 0.0 < result.score <= 1.0


def test_gpu_sample_alone_is_measured_and_goes_stale_only_when_it_stops(tmp_path: Path) -> None:
    clock = ManualClock()
    node = Node(tmp_path, clock, tracer=False)  # ingero gpu-sample writes the node DB
    s = sampler(tmp_path, clock)
    for _ in range(12):
        node.run(2.0)
        sample = s.sample()
        assert sample.state != "stale" and not sample.stalled, sample.state
        assert sample.result is not None
        assert sample.result.rates["gpu_busy_fraction"] > 0.9  # GPU busy is measured
    for _ in range(12):  # gpu-sample stopped writing
        clock.advance(2.0)
        sample = s.sample()
    assert sample.state == "stale"


def test_an_inference_servers_token_speed_is_its_throughput_against_its_peers(
    tmp_path: Path,
) -> None:
    """Launches at its peers' rate, per-token latency twice theirs: the token speed is what
    is compared (first in line), and the node scores as a replica half as fast."""
    clock = ManualClock()
    node = Node(tmp_path, clock)
    root = tmp_path / "engines-proc" / "40"
    root.mkdir(parents=True)
    (root / "cmdline").write_bytes(b"python3\0/v/bin/vllm\0serve\0llama\0")
    served = {"tokens": 0.0}

    def fetch(url: str, timeout_s: float, max_bytes: int) -> str:
        served["tokens"] += 1000.0
        n = served["tokens"]
        return (
            "# TYPE vllm:inter_token_latency_seconds histogram\n"
            f"vllm:inter_token_latency_seconds_sum {n * 0.04}\n"
            f"vllm:inter_token_latency_seconds_count {n}\n"
        )

    engines = EngineWatcher(
        db_path=tmp_path / "node.db", clock=clock, proc_root=root.parent, fetch=fetch
    )
    s = sampler(tmp_path, clock, engines=engines)
    for _ in range(5):
        node.run(2.0)
        alone = s.sample()
    assert alone.result is not None
    assert alone.result.rates[INFERENCE_TOKEN_RATE] == pytest.approx(25.0)
    node.run(2.0)
    peers = s.sample(peer_rates={"kernel_launch_rate": 4_645.0, INFERENCE_TOKEN_RATE: 50.0})
    assert peers.result is not None and peers.peer_rate == INFERENCE_TOKEN_RATE
    assert peers.result.signals["throughput"] == pytest.approx(0.5, abs=0.02)
    assert engines.summary()[40].model == "llama"


def vllm_tree(tmp_path: Path, clock: ManualClock) -> EngineWatcher:
    """A vLLM server (pid 40) with its engine-core child (41), and a training process (42)."""
    proc = tmp_path / "engines-proc"
    for pid, ppid, argv in (
        (40, 1, b"python3\0/v/bin/vllm\0serve\0llama\0"),
        (41, 40, b"python3\0-c\0from multiprocessing.spawn import spawn_main\0"),
        (42, 1, b"python3\0train.py\0"),
    ):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cmdline").write_bytes(argv)
        (proc / str(pid) / "stat").write_text(f"{pid} (python3 (x)) S {ppid} {pid} 0 0\n")
    return EngineWatcher(
        db_path=tmp_path / "node.db", clock=clock, proc_root=proc, fetch=lambda *_: ""
    )


def test_a_server_without_step_metrics_steps_at_its_workers_synchronize_calls(
    tmp_path: Path,
) -> None:
    """vLLM times no steps in /metrics: the tracer's synchronize calls of the server's
    process tree (its engine-core child here) are its steps; another process's are not."""
    clock = ManualClock()
    node = Node(tmp_path, clock)
    engines = vllm_tree(tmp_path, clock)
    s = sampler(tmp_path, clock, engines=engines)
    sample = None
    for _ in range(4):
        node.run(2.0)
        now = clock.now()
        with node.db.conn:
            node.db.table("intervals").insert_all(
                {"ts_start": now - 2.0, "ts_end": now, "pid": pid, "source": "cuda_driver",
                 "op": "cuStreamSynchronize", "count": count, "total_ns": 10**6}
                for pid, count in ((41, 100), (42, 7000))
            )  # fmt: skip
        sample = s.sample()
    assert sample is not None and sample.result is not None and sample.window is not None
    assert (sample.window.syncs[41], sample.window.syncs[42]) == (100, 7000)
    assert sample.result.rates[INFERENCE_STEP_RATE] == pytest.approx(100 / sample.window.covered_s)
    assert engines.trees() == {40: frozenset({40, 41})}


def test_a_straggler_learns_no_baseline_until_its_episode_ends(tmp_path: Path) -> None:
    """While its episode lasts the node's slower rates are not its new normal: its
    throughput and busy baselines hold, and its signals stay as low as it is slow."""
    clock = ManualClock()
    node = Node(tmp_path, clock)
    s = sampler(tmp_path, clock)
    for _ in range(5):
        node.run(2.0)
        s.sample()
    baselines = s.baselines.baselines
    held = {name: baselines[name].estimate for name in ("kernel_launch_rate", "gpu_busy_fraction")}
    for _ in range(40):
        node.run(2.0, slowdown=0.1)
        slow = s.sample(straggling=True)
    assert {name: baselines[name].estimate for name in held} == held
    assert slow.result is not None
    assert slow.result.signals["throughput"] == pytest.approx(0.9, abs=0.03)
    assert slow.result.signals["compute"] == pytest.approx(0.9, abs=0.03)
    # Outside an episode it learns, slowly while below (ema_alpha_down): 40 samples at
    # 0.02 take over half of the 10% into the baselines.
    for _ in range(40):
        node.run(2.0, slowdown=0.1)
        learnt = s.sample()
    assert learnt.result is not None
    assert learnt.result.signals["compute"] > 0.93
    for name, before in held.items():
        after = baselines[name].estimate
        assert before is not None and after is not None and after < before * 0.97, name


def test_a_node_is_judged_on_its_hosts_memory_not_its_full_gpus(tmp_path: Path) -> None:
    """A GPU full by design (PyTorch's caching allocator under a big training job, an
    inference engine's pool, 90% of it from the start) is not memory pressure: the memory
    signal is the host's free memory, for a training node and a serving one alike."""
    clock = ManualClock()
    node = Node(tmp_path, clock)
    total = 81_559 * 2**20
    training = sampler(tmp_path / "training", clock)
    serving = sampler(tmp_path, clock, engines=vllm_tree(tmp_path, clock))
    training.db_path = serving.db_path
    for _ in range(4):
        node.run(2.0, mem_free_bytes=total // 10, mem_total_bytes=total)
        trained, served = training.sample(), serving.sample()
    assert trained.window is not None
    (gpu,) = trained.window.gpus.values()  # the GPU itself is 90% full
    assert gpu.mem_free_bytes is not None and gpu.mem_total_bytes
    assert gpu.mem_free_bytes / gpu.mem_total_bytes == pytest.approx(0.1, abs=0.01)
    for sample in (trained, served):
        assert sample.result is not None
        assert sample.result.signals["memory"] == pytest.approx(0.9)  # the host's (meminfo)
        assert sample.result.penalty == 1.0
        assert sample.score >= 0.85


class RankNode:
    """One rank of a lock-step job (ingero.workload.lockstep) on its own node, its NCCL rows
    in the node DB as the tracer writes them, one interval per clock step."""

    def __init__(self, tmp_path: Path, clock: ManualClock, rank: int = 3) -> None:
        from ingero.workload.lockstep import JobProfile, LockstepJob

        self.path = tmp_path / "node.db"
        self.db = connect(self.path)
        self.job = LockstepJob(JobProfile(job_id="7", noise=0.01), start=clock.now(), seed=2)
        self.clock, self.rank = clock, rank

    def run(self, seconds: float, step: float = 1.0) -> None:
        for _ in range(round(seconds / step)):
            start = self.clock.now()
            self.clock.advance(step)
            rows = self.job.rows(self.rank, start, self.clock.now())
            for other in range(self.job.profile.ranks):  # the job goes on on every node
                if other != self.rank:
                    self.job.rows(other, start, self.clock.now())
            with self.db.conn:
                for table in ("intervals", "host_intervals", "gpu_intervals", "gpu_processes",
                              "nccl_calls", "nccl_comms"):  # fmt: skip
                    self.db.table(table).insert_all(getattr(rows, table))


def rank_sampler(tmp_path: Path, clock: ManualClock) -> NodeSampler:
    from ingero.push.config import NcclConfig

    return sampler(tmp_path, clock, collectives=NcclConfig(), pid_alive=lambda pid: True)


def test_a_lock_step_rank_is_not_judged_by_a_rate_the_whole_job_shares(tmp_path: Path) -> None:
    """Every rank of a lock-step job runs at its pace: when the whole job slows (a phase),
    a peer median a tick older than the node's rate says it is slow. Its throughput is not
    judged; an independent node's, against the same median, is."""
    clock = ManualClock()
    (tmp_path / "rank").mkdir()
    rank = RankNode(tmp_path / "rank", clock)
    s = rank_sampler(tmp_path / "rank", clock)
    for _ in range(6):
        rank.run(2.0)
        healthy = s.sample()
    assert healthy.state == "active" and healthy.result is not None
    assert "throughput" not in healthy.result.signals
    assert healthy.result.rates["kernel_launch_rate"] == pytest.approx(3_484.0, rel=0.1)
    assert healthy.collectives and healthy.collectives[0].nranks == 8
    median = {"kernel_launch_rate": healthy.result.rates["kernel_launch_rate"]}
    rank.job.phase(0.3)
    rank.run(2.0)
    phase = s.sample(peer_rates=median)
    assert phase.result is not None and phase.peer_rate is None
    assert "throughput" not in phase.result.signals
    assert phase.score == pytest.approx(healthy.score, abs=0.05)
    # The same change on a node of its own, against the same older median: slow.
    alone = Node(tmp_path, clock)
    lone = sampler(tmp_path, clock)
    for _ in range(5):
        alone.run(2.0)
        lone.sample()
    alone.run(2.0, slowdown=0.3)
    judged = lone.sample(peer_rates=median)
    assert judged.result is not None and judged.result.signals["throughput"] < 0.8


def test_a_lock_step_rank_that_waits_is_held_waiting_and_one_named_stalls(
    tmp_path: Path,
) -> None:
    from ingero.push.waiting import FleetNccl

    clock = ManualClock()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    waiting_node, missing_node = (
        RankNode(tmp_path / "a", clock, 3),
        RankNode(tmp_path / "b", clock, 5),
    )
    missing_node.job = waiting_node.job  # one job, two of its nodes
    a, b = rank_sampler(tmp_path / "a", clock), rank_sampler(tmp_path / "b", clock)

    def both(seconds: float = 2.0) -> None:
        for _ in range(round(seconds)):
            start = clock.now()
            clock.advance(1.0)
            for node in (waiting_node, missing_node):
                rows = node.job.rows(node.rank, start, clock.now())
                with node.db.conn:
                    for table in ("intervals", "host_intervals", "gpu_intervals",
                                  "gpu_processes", "nccl_calls", "nccl_comms"):  # fmt: skip
                        node.db.table(table).insert_all(getattr(rows, table))

    for _ in range(6):
        both()
        a.sample()
        b.sample()
    waiting_node.job.hang(5, clock.now())
    both(3.0)
    a.sample(), b.sample()
    said = {"event_id": "e", "comm_hash": waiting_node.job.comm_hash, "op": "ncclAllReduce",
            "seq": 9, "since": clock.now(), "ranks": [5], "nodes": ["n5"]}  # fmt: skip
    for _ in range(10):
        both()
        wait = a.sample(nccl=FleetNccl(waiting_for=said))
        assert (wait.waiting, wait.stalled, wait.held, wait.quiet) == (True, False, True, True)
        assert wait.waiting_for == said and wait.state == "active"
    # A waiting node whose own GPU reports an XID is not taken as waiting: its quiet may be
    # what the others wait for.
    start = clock.now()
    clock.advance(1.0)
    rows = waiting_node.job.rows(3, start, clock.now())
    missing_node.job.rows(5, start, clock.now())
    with waiting_node.db.conn:
        for table in ("intervals", "host_intervals", "gpu_processes", "nccl_calls", "nccl_comms"):
            waiting_node.db.table(table).insert_all(getattr(rows, table))
        waiting_node.db.table("gpu_intervals").insert_all(
            [{**r, "xid_count": 1, "xids": "[79]"} for r in rows.gpu_intervals]
        )
    faulty = a.sample(nccl=FleetNccl(waiting_for=said))
    assert not faulty.waiting and faulty.quiet
    both()
    stall = b.sample(nccl=FleetNccl(waited_for=True))
    assert stall.stalled and not stall.waiting and stall.quiet
    assert stall.result is not None and stall.result.signals["throughput"] == 0.0
