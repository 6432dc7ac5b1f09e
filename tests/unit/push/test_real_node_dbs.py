"""fleet-push's sampler on node DBs that ``ingero trace`` recorded on a real H200 node.

The generator's shapes are our model of a node; these DBs are the node itself (PyTorch
2.11, CUDA 13.0, driver 580; how each was recorded: tests/fixtures/h200/README.md). Each is
replayed in simulated time, one sample per second, as a lone node (own baselines): a
healthy job scores high and is never called stalled, whether it launches kernels, replays
CUDA graphs or waits on events, and a job made slower scores lower.
"""

from __future__ import annotations

import shutil
import sqlite3
import statistics
from pathlib import Path

import pytest

from bench import node_replay
from ingero.push.sampler import NodeSample

H200 = Path(__file__).resolve().parents[2] / "fixtures" / "h200"
# When each recording's job was made slower (wall clock; README.md says by how much).
SLOWED_AT = {"mlp.db": 1795782642.39, "decode.db": 1795782696.47}


def replay(name: str, tmp_path: Path) -> list[NodeSample]:
    db = tmp_path / name
    shutil.copy(H200 / name, db)  # the reader may leave WAL files beside it
    return node_replay.replay(db, 1.0)


def scored(samples: list[NodeSample]) -> list[NodeSample]:
    return [
        s
        for s in samples
        if s.result is not None and not s.held and s.state in ("calibrating", "active")
    ]


def op_counts(name: str) -> dict[str, int]:
    with sqlite3.connect(f"file:{H200 / name}?mode=ro", uri=True) as con:
        return dict(con.execute("SELECT op, sum(count) FROM intervals GROUP BY op").fetchall())


@pytest.mark.parametrize("name", ["mlp.db", "decode.db", "graphs.db"])
def test_a_healthy_real_job_is_active_scores_high_and_never_stalls(
    name: str, tmp_path: Path
) -> None:
    samples = replay(name, tmp_path)
    healthy = [s for s in scored(samples) if s.timestamp <= SLOWED_AT.get(name, float("inf"))]
    assert len(healthy) >= 5
    assert not any(s.stalled for s in samples)
    assert statistics.median(s.score for s in healthy) >= 0.9


@pytest.mark.parametrize("name", ["mlp.db", "decode.db"])
def test_a_real_job_made_slower_scores_lower(name: str, tmp_path: Path) -> None:
    samples = scored(replay(name, tmp_path))
    before = [s for s in samples if s.timestamp <= SLOWED_AT[name]]
    after = [s for s in samples if s.timestamp > SLOWED_AT[name] + 1.0]
    median_before = statistics.median(s.score for s in before)
    median_after = statistics.median(s.score for s in after)
    assert median_after < median_before - 0.1
    throughput = [s.result.signals["throughput"] for s in after if s.result is not None]
    assert statistics.median(throughput) < 0.85


def test_a_job_replaying_graphs_is_measured_by_its_graph_launches(tmp_path: Path) -> None:
    # The decode loop launches no kernel of its own: every step is one graph replay, a copy
    # and an event wait. Its work is the graph launch rate.
    ops = op_counts("decode.db")
    assert "cudaLaunchKernel" not in ops and "cuLaunchKernel" not in ops
    assert ops["cudaGraphLaunch"] == ops["cudaEventSynchronize"] == ops["cudaEventRecord"]
    healthy = scored(replay("decode.db", tmp_path))[:8]
    for s in healthy:
        assert s.result is not None
        assert s.result.rates["graph_launch_rate"] > 1000
        assert s.result.rates["kernel_launch_rate"] == 0


def test_torch_compile_replays_through_the_runtime_one_launch_per_replay() -> None:
    # torch.compile mode="reduce-overhead": cudaGraphLaunch, each with one cudaLaunchKernel
    # (the input copy); the driver's cuGraphLaunch is never called.
    ops = op_counts("graphs.db")
    assert ops["cudaGraphLaunch"] > 10_000
    assert ops["cudaLaunchKernel"] == ops["cudaGraphLaunch"]
    assert "cuGraphLaunch" not in ops


def test_event_waits_are_the_decode_streams_steps() -> None:
    # Each event synchronize is a sync of the stream its event was recorded on, and the
    # gaps between them are that stream's steps.
    with sqlite3.connect(f"file:{H200 / 'decode.db'}?mode=ro", uri=True) as con:
        rows = con.execute(
            "SELECT stream, sum(syncs), sum(steps) FROM stream_intervals GROUP BY stream"
        ).fetchall()
    waits = op_counts("decode.db")["cudaEventSynchronize"]
    ((stream, syncs, steps),) = rows
    assert stream == "0" * 16  # PyTorch's legacy default stream
    # The counters and the stream map are read a moment apart at each interval's end: a
    # call in between lands in one interval's row and the next's.
    assert abs(syncs - waits) <= 2
    assert abs(steps - waits) <= 2


def test_config_launches_name_the_same_stream_as_the_runtimes() -> None:
    # cuBLASLt launches through cuLaunchKernelEx (the stream read from its config struct);
    # PyTorch's own kernels through cudaLaunchKernel: one training loop, one stream.
    ops = op_counts("mlp.db")
    assert ops["cuLaunchKernelEx"] > 10_000
    with sqlite3.connect(f"file:{H200 / 'mlp.db'}?mode=ro", uri=True) as con:
        rows = con.execute(
            "SELECT stream, sum(launches) FROM stream_intervals GROUP BY stream"
        ).fetchall()
    launches = ops["cudaLaunchKernel"] + ops["cuLaunchKernelEx"] + ops["cuLaunchKernel"]
    ((stream, on_stream),) = rows
    assert stream == "0" * 16
    assert abs(on_stream - launches) <= 2
