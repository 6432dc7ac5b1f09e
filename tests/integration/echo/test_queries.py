"""Each question answered over a real store, checked against figures worked out by hand."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ingero.echo.auth import AccessDenied, Principal
from ingero.echo.questions import BadRequest
from ingero.echo.rates import GpuRates
from ingero.echo.rows import ScorePoint
from ingero.echo.service import Service
from ingero.echo.store import Store
from ingero.runtime.clock import ManualClock

from .helpers import straggler

pytestmark = pytest.mark.integration

OPS = Principal("ops")
TENANT_A = Principal("tenant-a", frozenset({"A"}))


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    clock = ManualClock(start=10_000.0)
    store = Store(tmp_path / "e.db", clock=clock)
    try:
        store.write(
            [
                # n1: 300 s below in job 7, depth up to 0.5, resolved
                straggler("n1", "A", 1000.0, score=0.6, gpu_model="NVIDIA H100", gpu_count=8),
                straggler("n1", "A", 1300.0, score=0.3),
                straggler("n1", "A", 1300.0, kind="straggler_resolved", score=0.9),
                # n2: two episodes of 100 s and 50 s, shallow
                straggler("n2", "A", 1000.0, score=0.75),
                straggler("n2", "A", 1100.0, score=0.75),
                straggler("n2", "A", 1100.0, kind="straggler_resolved", score=0.9),
                straggler("n2", "A", 2000.0, score=0.7),
                straggler("n2", "A", 2050.0, score=0.7),
                # cluster B must never leak to tenant A
                straggler("beta-node", "B", 1000.0, score=0.1),
                straggler("beta-node", "B", 5000.0, score=0.1),
                straggler(
                    "beta-node", "B", 5000.0, kind="node_drained", reason="ingero: score 0.1"
                ),
                straggler("n1", "A", 1400.0, kind="job_summary", job="7", steps=100),
                straggler("n2", "A", 1500.0, kind="peer_lag", job="7", lag_ms=40.0, peer="n1"),
            ],
            scores=[
                ScorePoint("A", f"h{i}", 1000.0 + t, 0.9 if i else 0.2)
                for i in range(6)
                for t in (0.0, 30.0)
            ],
        )
        yield Service(store.path, GpuRates("USD", 1.0, {"H100": 4.0}), clock=clock)
    finally:
        store.close()


def ask(service: Service, name: str, who: Principal = OPS, **raw: object) -> dict:  # type: ignore[type-arg]
    return service.answer(name, raw, who)


def test_stragglers_ranked_by_time_depth_and_episodes(service: Service) -> None:
    by_time = ask(service, "stragglers", cluster_id="A", since=0)["stragglers"]
    assert [(r["node_id"], r["seconds_below"], r["episodes"]) for r in by_time] == [
        ("n1", 300.0, 1),
        ("n2", 150.0, 2),
    ]
    assert by_time[1]["open"] is True and by_time[0]["open"] is False
    by_depth = ask(service, "stragglers", cluster_id="A", since=0, order_by="depth")
    assert [r["node_id"] for r in by_depth["stragglers"]] == ["n1", "n2"]
    by_eps = ask(service, "stragglers", cluster_id="A", since=0, order_by="episodes")
    assert [r["node_id"] for r in by_eps["stragglers"]] == ["n2", "n1"]
    windowed = ask(service, "stragglers", cluster_id="A", since=1200, until=2025)["stragglers"]
    assert [(r["node_id"], r["seconds_below"]) for r in windowed] == [("n1", 100.0), ("n2", 25.0)]
    last = ask(service, "stragglers", cluster_id="A", until=2025, last="825s")
    assert last["window"] == {"since": 1200.0, "until": 2025.0}
    assert last["stragglers"] == windowed
    everyone = ask(service, "stragglers", since=0)["stragglers"]
    assert everyone[0]["node_id"] == "beta-node" and everyone[0]["seconds_below"] == 4000.0


def test_cost_uses_gpu_count_and_model_rate(service: Service) -> None:
    answer = ask(service, "cost", cluster_id="A", since=0)
    n1 = next(r for r in answer["nodes"] if r["node_id"] == "n1")
    assert n1["gpu_hours_lost"] == pytest.approx(300 / 3600 * 8)
    assert n1["cost"] == pytest.approx(300 / 3600 * 8 * 4.0)
    n2 = next(r for r in answer["nodes"] if r["node_id"] == "n2")
    assert n2["gpu_count"] == 1 and n2["rate_per_gpu_hour"] == 1.0
    assert answer["total_cost"] == pytest.approx(n1["cost"] + n2["cost"])
    assert any("counted as 1 GPU" in note for note in answer["notes"])


def test_outliers_events_drains_job_report_summary(service: Service) -> None:
    out = ask(service, "outliers", cluster_id="A", since=0)["outliers"]
    assert [r["node_id"] for r in out] == ["h0"]
    ev = ask(service, "events", cluster_id="A", node_id="n2", type="straggler_state", since=0)
    assert len(ev["events"]) == 4 and ev["events"][0]["timestamp"] == 2050.0
    assert len(ask(service, "events", cluster_id="A", node_id="n2", since=0)["events"]) == 6
    drains = ask(service, "drains", since=0)["drains"]
    assert [d["node_id"] for d in drains] == ["beta-node"]
    assert drains[0]["extra"] == {"reason": "ingero: score 0.1"}
    report = ask(service, "job_report", job_id="7", cluster_id="A")
    assert report["found"] and report["event_counts"]["job_summary"] == 1
    assert report["summaries"][0]["extra"]["steps"] == 100
    assert report["peer_lag"][0]["extra"] == {"lag_ms": 40.0, "peer": "n1"}
    assert [n["node_id"] for n in report["stragglers"]] == ["n1", "n2"]
    summary = ask(service, "summary", since=0)["clusters"]
    assert [(c["cluster_id"], c["drains"], c["straggler_nodes"]) for c in summary] == [
        ("A", 0, 2),
        ("B", 1, 1),
    ]


def test_a_tenant_gets_nothing_of_another_cluster_from_any_question(service: Service) -> None:
    for name, raw in [
        ("summary", {}),
        ("stragglers", {}),
        ("outliers", {}),
        ("events", {}),
        ("drains", {}),
        ("cost", {}),
        ("job_report", {"job_id": "7"}),
    ]:
        window = {} if name == "job_report" else {"since": 0}
        text = repr(service.answer(name, {**raw, **window}, TENANT_A))
        assert "'B'" not in text and "beta-node" not in text, name
        if name != "job_report":
            with pytest.raises(AccessDenied):
                service.answer(name, {"cluster_id": "B"}, TENANT_A)
    assert service.answer("sql", {"query": "SELECT count(*) FROM events"}, TENANT_A)["rows"] == [
        [10]
    ]


def test_a_node_filter_finds_the_node_in_every_cluster_it_is_in(tmp_path: Path) -> None:
    """Events are indexed by (cluster, time, node); a node filter without a cluster goes
    through the nodes table to the node's clusters, and scoping still applies."""
    clock = ManualClock(start=10_000.0)
    store = Store(tmp_path / "e.db", clock=clock)
    try:
        store.write(
            [
                straggler("twin", "A", 1000.0),
                straggler("twin", "B", 1500.0),
                straggler("twin", "A", 2000.0, kind="straggler_resolved"),
                straggler("other", "A", 1200.0),
            ]
        )
        service = Service(store.path, GpuRates("USD", 1.0, {}), clock=clock)
        everywhere = ask(service, "events", node_id="twin", since=0)["events"]
        assert [(e["cluster_id"], e["timestamp"]) for e in everywhere] == [
            ("A", 2000.0),
            ("B", 1500.0),
            ("A", 1000.0),
        ]
        scoped = ask(service, "events", TENANT_A, node_id="twin", since=0)["events"]
        assert [(e["cluster_id"], e["timestamp"]) for e in scoped] == [("A", 2000.0), ("A", 1000.0)]
        assert ask(service, "events", node_id="nobody", since=0)["events"] == []
        in_b = ask(service, "events", cluster_id="B", node_id="twin", since=0)["events"]
        assert [e["timestamp"] for e in in_b] == [1500.0]
    finally:
        store.close()


def test_questions_are_stopped_at_the_time_limit(tmp_path: Path) -> None:
    """The SQL time limit holds for questions: with a limit already passed, a question that
    reads more than SQLite's 1,000-step check interval is stopped with a clear error."""
    clock = ManualClock(start=100_000.0)
    store = Store(tmp_path / "e.db", clock=clock)
    try:
        store.write([straggler(f"n{i % 50}", "A", 1000.0 + i, score=0.5) for i in range(3000)])
    finally:
        store.close()
    rates = GpuRates("USD", 1.0, {})
    stopped = Service(store.path, rates, clock=clock, sql_timeout=0.0)
    roomy = Service(store.path, rates, clock=clock, sql_timeout=60.0)
    for name in ("stragglers", "events", "cost"):
        with pytest.raises(BadRequest, match="ran longer than 0s and was stopped"):
            ask(stopped, name, since=0)
        assert ask(roomy, name, since=0)["truncated"] in (True, False)
