"""The questions behind the dashboard (``jobs``, ``job_timeline``) over a real store, and a
1,000-rank job's page bounded whatever the job's size."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.dashboard import CLUSTER, START, fill, job_id
from ingero.echo.auth import AccessDenied, Principal
from ingero.echo.dashboard import view
from ingero.echo.questions import BadRequest
from ingero.echo.rates import GpuRates
from ingero.echo.service import Service
from ingero.echo.store import Store
from ingero.runtime.clock import ManualClock

pytestmark = pytest.mark.integration

OPS = Principal("ops")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, dict[int, str]]]:
    clock = ManualClock(start=START + 3600.0)
    store = Store(tmp_path_factory.mktemp("timeline") / "e.db", clock=clock)
    try:
        slow = {ranks: fill(store, ranks) for ranks in (10, 1000)}
        fill(store, 10, cluster="other")
        yield Service(store.path, GpuRates("USD", 1.0, {}), clock=clock), slow
    finally:
        store.close()


def test_a_1000_rank_job_is_answered_and_rendered_bounded(
    service: tuple[Service, dict[int, str]],
) -> None:
    svc, slow = service
    args = {"cluster_id": CLUSTER, "job_id": job_id(1000)}
    timeline = svc.answer("job_timeline", args, OPS)
    assert timeline["found"] and timeline["node_count"] == 1000
    assert len(timeline["nodes"]) == 50  # the question's default limit
    assert timeline["nodes"][0]["node_id"] == slow[1000]  # the straggler first
    assert timeline["nodes"][0]["straggling"] and timeline["nodes"][0]["rank"] == 500
    assert len(timeline["band"]) <= 120 and len(timeline["series"]) == 8
    assert timeline["series"][0]["node_id"] == slow[1000]
    assert min(p[1] for p in timeline["series"][0]["points"]) == pytest.approx(0.3)
    heat = timeline["lag_heatmap"]
    assert len(heat["cells"]) <= 32 and all(len(row) == 120 for row in heat["cells"])
    assert heat["ranks"][0][0] == 0 and heat["ranks"][-1][1] == 990  # every 10th rank lags
    assert [d["type"] for d in timeline["drains"]] == ["node_drained"]
    report = svc.answer("job_report", args, OPS)
    page = view.job_page(CLUSTER, timeline, report, running=True, signed_in=False)
    assert len(page.encode()) < 200_000
    assert page.count("<tr>") <= view.MAX_ROWS
    assert "50 of 1000 shown" in page


def test_jobs_lists_running_jobs_first_within_the_token(
    service: tuple[Service, dict[int, str]],
) -> None:
    svc, _ = service
    answer = svc.answer("jobs", {"since": 0}, OPS)
    assert {(j["cluster_id"], j["job_id"]) for j in answer["jobs"]} == {
        (CLUSTER, "job10"),
        (CLUSTER, "job1000"),
        ("other", "job10"),
    }
    big = next(j for j in answer["jobs"] if j["job_id"] == "job1000")
    assert big["nodes"] == 1000 and big["open_episodes"] == 1 and big["running"]
    tenant = Principal("t", frozenset({"other"}))
    answer = svc.answer("jobs", {"since": 0}, tenant)
    assert [(j["cluster_id"], j["job_id"]) for j in answer["jobs"]] == [("other", "job10")]
    with pytest.raises(AccessDenied):
        svc.answer("job_timeline", {"cluster_id": CLUSTER, "job_id": "job10"}, tenant)
    # without a cluster, the tenant's own job of that name and nothing of the other's
    mine = svc.answer("job_timeline", {"job_id": "job10"}, tenant)
    assert {n["cluster_id"] for n in mine["nodes"]} == {"other"}


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ({}, "parameter job_id is required"),
        ({"job_id": "job10", "columns": "1"}, "columns must be at least 2"),
        ({"job_id": "job10", "columns": "x"}, "columns must be an integer"),
        ({"job_id": "job10", "since": "10", "until": "5"}, "since must not be after until"),
        ({"job_id": "job10", "nodes": "5"}, "unknown parameter 'nodes'"),
    ],
)
def test_job_timeline_refuses_bad_parameters(
    service: tuple[Service, dict[int, str]], raw: dict[str, str], said: str
) -> None:
    with pytest.raises(BadRequest, match=said):
        service[0].answer("job_timeline", raw, OPS)


def test_an_unknown_job_is_not_found(service: tuple[Service, dict[int, str]]) -> None:
    answer = service[0].answer("job_timeline", {"job_id": "nope"}, OPS)
    assert not answer["found"] and answer["nodes"] == [] and answer["band"] == []


def test_page_text_is_escaped(tmp_path: Path) -> None:
    clock = ManualClock(start=START + 3600.0)
    store = Store(tmp_path / "e.db", clock=clock)
    try:
        fill(store, 10, cluster="<i>c</i>")
        svc = Service(store.path, GpuRates("USD", 1.0, {}), clock=clock)
        args = {"cluster_id": "<i>c</i>", "job_id": job_id(10)}
        timeline = svc.answer("job_timeline", args, OPS)
        report = svc.answer("job_report", args, OPS)
        page = view.job_page("<i>c</i>", timeline, report, running=False, signed_in=False)
        assert "<i>c</i>" not in page and "&lt;i&gt;c&lt;/i&gt;" in page
        assert "/dashboard/clusters/%3Ci%3Ec%3C%2Fi%3E/jobs/job10" in page
        assert 'http-equiv="refresh"' not in page  # an ended job's page stays put
    finally:
        store.close()
