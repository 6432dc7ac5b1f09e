"""``ingero explain`` on a job that replays CUDA graphs: graphs built again in the loop are a
cause, a build at start-up is not, and the work that drops is the graph launch rate."""

from __future__ import annotations

from ingero.explain.analysis import OpStats, WindowData, explain
from ingero.explain.chains import OpPoint, Timeline, explain_chains, signals
from ingero.fanout.across import top_line

SPLIT = 60.0


def timeline(builds_at: dict[int, int], replays: int = 100, slow_from: int = 61) -> Timeline:
    """Two minutes of one process: ``replays`` cuGraphLaunch a second (30% fewer from
    ``slow_from``), and per second in ``builds_at`` that many graphs captured and built."""
    ops = []
    for t in range(1, 121):
        n = replays if t < slow_from else int(replays * 0.7)
        ops.append(OpPoint(t - 1.0, float(t), 7, "cuda_driver", "cuGraphLaunch", n, n * 15_000,
                           20_000.0))  # fmt: skip
        k = builds_at.get(t, 0)
        for op, ns in (("cuStreamBeginCapture", 5_000), ("cuStreamEndCapture", 2_000_000),
                       ("cuGraphInstantiate", 8_000_000)):  # fmt: skip
            if k:
                ops.append(OpPoint(t - 1.0, float(t), 7, "cuda_driver", op, k, k * ns, ns * 1.2))
    return Timeline(start=0.0, split=SPLIT, end=120.0, ops=tuple(ops))


def test_graphs_built_again_in_the_loop_are_the_cause_of_the_graph_launch_drop() -> None:
    t = timeline({1: 2, **{s: 3 for s in range(61, 121)}})
    found = signals(t)
    recapture = found["graph_recapture"]
    assert recapture.evidence["builds"] == 180 and recapture.evidence["rate"] == 3.0
    # 180 builds of ~10 ms in 60 s: 3% of the process's wall time went to building graphs
    assert recapture.evidence["share"] == 0.03 and recapture.onset == 61.0
    drop = found["throughput_drop"]
    assert drop.evidence["metric"] == "graph-launch rate" and drop.evidence["drop"] == 0.3
    top = explain_chains(t)[0]
    assert top.rule == "graph_recapture" and top.effect == drop


def test_a_graph_built_at_start_or_once_is_not_a_loop() -> None:
    assert "graph_recapture" not in signals(timeline({1: 2}))
    # One rebuild in the recent minute (a new shape, once): below MIN_BUILDS.
    assert "graph_recapture" not in signals(timeline({1: 2, 90: 2}))
    # As many builds before as now: the loop did not change.
    steady = {s: 1 for s in range(1, 121)}
    assert "graph_recapture" not in signals(timeline(steady))


def test_the_ranked_findings_name_a_graph_launch_rate_drop() -> None:
    w = 300.0

    def window(end: float, replays: int) -> WindowData:
        ops = (OpStats("cuda_driver", "cuGraphLaunch", replays, replays * 15_000, 12e3, 2e4, 3e4),)
        return WindowData(start=end - w, end=end, covered_s=w, pids=1, ops=ops)

    report = explain(window(2 * w, 21_000), window(w, 30_000), w)
    first = report.findings[0]
    assert first.kind == "graph_launch_rate"
    assert first.message.startswith("graph-launch rate down 30%")
    assert report.summary["graph_launch_rate"] == 70.0
    assert report.summary["graph_launch_rate_baseline"] == 100.0
    # An eager job has no graph-launch rate (not a rate of 0).
    eager = (OpStats("cuda_driver", "cuLaunchKernel", 9, 9, 1.0, 1.0, 1.0),)
    none = explain(WindowData(w, 2 * w, w, 1, eager), WindowData(0, w, w, 1, eager), w)
    assert none.summary["graph_launch_rate"] is None


def test_a_node_without_a_chain_shows_its_graph_launches_across_nodes() -> None:
    graphs = {"summary": {"kernel_launch_rate": 0.0, "graph_launch_rate": 70.0}, "chains": []}
    assert top_line("n1", graphs) == "n1: no causal chain (graph launches 70/s)"
    eager = {"summary": {"kernel_launch_rate": 3484.0, "graph_launch_rate": None}, "chains": []}
    assert top_line("n2", eager) == "n2: no causal chain (kernel launches 3,484/s)"
