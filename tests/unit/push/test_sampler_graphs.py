"""A node whose job replays CUDA graphs (cudaGraphLaunch, with one cudaLaunchKernel per replay,
as a real H200 recorded torch.compile reduce-overhead) is sampled as an eager one: it calibrates, scores its slowdown, stalls, recovers and is
compared with its peers, on its graph launch rate."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingero.nodedb.window import aggregate_window
from ingero.push.sampler import NodeSample, NodeSampler
from ingero.runtime.clock import ManualClock
from tests.unit.push.test_sampler import Node, sampler


def warmed(tmp_path: Path, slowdown: float = 0.0) -> tuple[Node, NodeSampler, NodeSample]:
    """A graph-replaying node and its sampler after five samples (warm-up is three)."""
    clock = ManualClock()
    node = Node(tmp_path, clock, shape="graphs")
    s = sampler(tmp_path, clock)
    for _ in range(5):
        node.run(2.0, slowdown=slowdown)
        last = s.sample()
    return node, s, last


def graph_row(ts_end: float, op: str, count: int, pid: int = 7) -> dict[str, object]:
    return {"ts_start": ts_end - 1.0, "ts_end": ts_end, "op": op, "count": count,
            "total_ns": count * 1000, "pid": pid}  # fmt: skip


def test_graph_launches_are_work_with_a_rate_of_their_own() -> None:
    rows = [graph_row(float(t), "cuGraphLaunch", 100) for t in (1, 2, 3)]
    rows += [graph_row(3.0, "cudaGraphLaunch", 30, pid=8), graph_row(3.0, "cuGraphInstantiate", 2)]
    window = aggregate_window(0.0, 3.0, rows, after=1.0)
    assert window.graph_launches == 330 and window.kernel_launches == 0
    assert window.graph_launch_rate == pytest.approx(110.0)
    assert window.kernel_launch_rate == 0.0
    # The work of the intervals after the previous window: graph replays are launches.
    assert (window.new_intervals, window.new_launches) == (2, 230)
    assert window.launch_pids == (7, 8)
    # A job that launches no graph has no graph launch rate (not a rate of 0).
    eager = aggregate_window(0.0, 1.0, [graph_row(1.0, "cuLaunchKernel", 500)])
    assert eager.graph_launch_rate is None and eager.kernel_launch_rate == 500.0


def test_a_graph_replaying_node_scores_its_slowdown_on_its_graph_launch_rate(
    tmp_path: Path,
) -> None:
    node, s, healthy = warmed(tmp_path)
    assert healthy.state == "active" and not healthy.stalled and not healthy.held
    assert healthy.result is not None
    assert healthy.result.rates["graph_launch_rate"] == pytest.approx(100.0, rel=0.05)
    # The input copies are kernel launches; the throughput is read on the graph replays.
    assert healthy.result.rates["kernel_launch_rate"] == pytest.approx(100.0, rel=0.05)
    assert healthy.result.rates["throughput_baseline"] == pytest.approx(100.0, rel=0.05)
    assert healthy.result.signals["throughput"] == pytest.approx(1.0, abs=0.05)
    node.run(2.0, slowdown=0.3)
    slow = s.sample()
    assert slow.result is not None
    assert slow.result.signals["throughput"] == pytest.approx(0.7, abs=0.05)
    assert slow.result.dominant_signal == "throughput"
    assert slow.score < healthy.score - 0.1
    node.run(2.0)
    again = s.sample()
    assert again.result is not None
    assert again.result.signals["throughput"] == pytest.approx(1.0, abs=0.05)


def test_a_stalled_graph_replaying_rank_is_stalled_then_idle_when_its_job_ends(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    node = Node(tmp_path, clock, shape="graphs")
    alive = {4242}
    s = sampler(tmp_path, clock, pid_alive=lambda pid: pid in alive)
    for _ in range(4):
        node.run(2.0)
        healthy = s.sample()
    node.gpu_rows = False
    node.run(2.0, stalled=True)
    stalled = s.sample()
    assert stalled.state == "active" and stalled.stalled and stalled.job_running is True
    assert stalled.result is not None
    assert stalled.result.rates["graph_launch_rate"] == 0.0
    assert stalled.result.signals["throughput"] == 0.0
    assert stalled.score < healthy.score - 0.4
    node.run(2.0)  # it replays again
    back = s.sample()
    assert not back.stalled and back.result is not None
    assert back.result.signals["throughput"] == pytest.approx(1.0, abs=0.05)
    node.run(2.0, stalled=True)
    assert s.sample().stalled
    alive.clear()  # the job ends
    node.run(2.0, stalled=True)
    ended = s.sample()
    assert ended.state == "idle" and not ended.stalled and ended.job_running is False


def test_a_graph_replaying_node_slow_from_birth_is_seen_against_its_peers(
    tmp_path: Path,
) -> None:
    node, s, alone = warmed(tmp_path, slowdown=0.25)
    assert alone.result is not None
    assert alone.result.signals["throughput"] == pytest.approx(1.0, abs=0.05)
    node.run(2.0, slowdown=0.25)
    # Its peers replay graphs too: their kernel launch rate median is 0, the graph one not.
    peers = s.sample(peer_rates={"kernel_launch_rate": 0.0, "graph_launch_rate": 100.0})
    assert peers.peer_rate == "graph_launch_rate" and peers.result is not None
    assert peers.result.signals["throughput"] == pytest.approx(0.75, abs=0.05)
    assert peers.score < alone.score - 0.08
