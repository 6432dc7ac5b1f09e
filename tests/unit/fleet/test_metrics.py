"""Fleet's /metrics text: the opt-in per-node series and their bound, the drain-failure
counter, build info, and no _created series."""

from __future__ import annotations

from typing import NamedTuple

from prometheus_client.parser import text_string_to_metric_families

from ingero import __version__
from ingero.fleet.config import FleetConfig
from ingero.fleet.metrics import FleetMetrics
from ingero.fleet.state import FleetState
from ingero.otlp.health import NodePush
from ingero.runtime.clock import ManualClock


class Row(NamedTuple):
    node_id: str
    cluster_id: str
    group: str
    job_id: str | None
    score: float
    state: str


def samples(metrics: FleetMetrics) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = metrics.render().decode()
    return {
        f.name: [(s.labels, s.value) for s in f.samples]
        for f in text_string_to_metric_families(text)
    }


def rows(n: int) -> list[Row]:
    return [Row(f"n{i}", "c", "c/job/1", "1", 0.5 + i / 100, "active") for i in range(n)]


def test_node_series_are_off_by_default() -> None:
    metrics = FleetMetrics()
    metrics.update_nodes(rows(3), set(), 3)
    found = samples(metrics)
    assert "ingero_fleet_node_score" not in found
    assert "ingero_fleet_node_series_omitted" not in found


def test_state_keeps_stragglers_then_lowest_scores_past_the_limit() -> None:
    state = FleetState(FleetConfig(), ManualClock())
    for i, score in enumerate([0.9, 0.5, 0.95, 0.6, 0.99, 0.7]):
        state.ingest(NodePush(node_id=f"n{i}", cluster_id="c", score=score, job_id="1"))
    state.tick()
    kept = state.scores_snapshot(3, {("c", "n4"), ("c", "nobody"), ("other", "n5")})
    assert {r.node_id for r in kept} == {"n4", "n1", "n3"}  # n4 named, then 0.5 and 0.6
    assert len(state.scores_snapshot(10, {("c", "n4")})) == 6
    assert len(state.scores_snapshot()) == 6


def test_node_series_mark_stragglers_and_count_the_rest() -> None:
    metrics = FleetMetrics(node_series_limit=3)
    nodes = [rows(6)[i] for i in (4, 0, 1)]
    nodes[2] = nodes[2]._replace(state="idle")
    metrics.update_nodes(nodes, {("c", "n4"), ("other", "n0")}, 6)
    found = samples(metrics)
    kept = {labels["node_id"]: value for labels, value in found["ingero_fleet_node_score"]}
    assert kept == {"n4": 0.54, "n0": 0.5, "n1": 0.51}
    flags = {labels["node_id"]: value for labels, value in found["ingero_fleet_node_straggler"]}
    assert flags == {"n0": 0.0, "n1": 0.0, "n4": 1.0}  # n0 straggles in another cluster
    active = {labels["node_id"]: value for labels, value in found["ingero_fleet_node_active"]}
    assert active == {"n0": 1.0, "n1": 0.0, "n4": 1.0}
    assert found["ingero_fleet_node_series_omitted"] == [({}, 3.0)]
    # the next tick replaces the set: vanished nodes lose their series
    metrics.update_nodes(nodes[1:2], set(), 1)
    found = samples(metrics)
    assert [labels["node_id"] for labels, _ in found["ingero_fleet_node_active"]] == ["n0"]
    assert found["ingero_fleet_node_series_omitted"] == [({}, 0.0)]


def test_labels_are_escaped() -> None:
    metrics = FleetMetrics(node_series_limit=10)
    metrics.update_nodes([Row('n"1\\', "c\n", "g", None, 0.5, "active")], set(), 1)
    (labels, _), *_ = samples(metrics)["ingero_fleet_node_score"]
    assert labels == {"node_id": 'n"1\\', "cluster_id": "c\n", "group": "g", "job_id": ""}


def test_drain_failures_build_info_and_no_created_series() -> None:
    metrics = FleetMetrics()
    metrics.count_request("http", "metrics", "200", 0.001)
    failures = [0]
    metrics.read_drain_failures(lambda: failures[0])
    failures[0] = 4
    found = samples(metrics)
    assert found["ingero_fleet_drain_failures"] == [({}, 4.0)]
    assert found["ingero_build_info"][0][0]["version"] == __version__
    assert b"_created" not in metrics.render()


def test_clock_offsets_are_exported_largest_first_within_the_limit() -> None:
    metrics = FleetMetrics(clock_offset_limit=2)
    metrics.update_clock_offsets(
        [("c", "n0", 0.001, 0.0005), ("c", "n1", -2.5, 0.001), ("c", "n2", 1.5, 0.001)]
    )
    found = samples(metrics)["ingero_fleet_node_clock_offset_seconds"]
    assert sorted((s["node_id"], v) for s, v in found) == [("n1", -2.5), ("n2", 1.5)]
    assert all(s.keys() == {"cluster_id", "node_id"} for s, _ in found)


def test_nccl_figures() -> None:
    metrics = FleetMetrics()
    metrics.update_nccl(3, 1, 2, ["peer_lag", "collective_hang", "peer_lag"])
    metrics.update_nccl(3, 0, 5, [])
    found = samples(metrics)
    assert found["ingero_fleet_nccl_communicators"] == [({}, 3.0)]
    assert found["ingero_fleet_nccl_hung_communicators"] == [({}, 0.0)]
    assert found["ingero_fleet_nccl_refused"] == [({}, 5.0)]
    episodes = {s["type"]: v for s, v in found["ingero_fleet_nccl_episodes"]}
    assert episodes == {"peer_lag": 2.0, "collective_hang": 1.0}


def test_verdict_and_idle_resume_counters_only_while_their_part_runs() -> None:
    metrics = FleetMetrics()
    names = set(samples(metrics))
    assert not {"ingero_fleet_verdicts", "ingero_fleet_idle_resumes"} & names
    metrics.slurm_counts.verdicts = lambda: {"written": 3, "refused": 1}
    metrics.slurm_counts.verdict_failures = lambda: 2
    metrics.slurm_counts.resumes = lambda: {
        ("resumed", "verified"): 1,
        ("refused", "resume_budget"): 4,
    }
    found = samples(metrics)
    assert sorted(found["ingero_fleet_verdicts"], key=str) == [
        ({"outcome": "refused"}, 1.0),
        ({"outcome": "written"}, 3.0),
    ]
    assert found["ingero_fleet_verdict_failures"] == [({}, 2.0)]
    assert sorted(found["ingero_fleet_idle_resumes"], key=str) == sorted(
        [
            ({"outcome": "resumed", "reason": "verified"}, 1.0),
            ({"outcome": "refused", "reason": "resume_budget"}, 4.0),
        ],
        key=str,
    )
