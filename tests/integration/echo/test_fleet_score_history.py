"""A real ``ingero fleet`` forwards a downsampled per-node score history to a real Echo,
whose ``outliers`` question (HTTP API) then names the straggler among the pushing nodes."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from ingero.otlp.health import NodePush
from tests.integration.fleet.helpers import start_fleet, wait_for

from .helpers import TOKEN_OPS, EchoProcess, http

pytestmark = pytest.mark.integration

HEALTHY = [0.90, 0.91, 0.89, 0.92, 0.88, 0.90]


def ask(echo: EchoProcess, name: str, **params: Any) -> Any:
    status, body = http(
        "GET", f"{echo.url}/api/v1/{name}?{urllib.parse.urlencode(params)}", token=TOKEN_OPS
    )
    assert status == 200, body
    return body


def sql(echo: EchoProcess, query: str) -> list[list[Any]]:
    body = json.dumps({"query": query}).encode()
    status, answer = http("POST", f"{echo.url}/api/v1/sql", body, TOKEN_OPS)
    assert status == 200, answer
    return list(answer["rows"])


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_pushed_scores_reach_echo_history_and_the_straggler_is_an_outlier(
    tmp_path: Path, transport: str
) -> None:
    (tmp_path / "echo").mkdir()
    echo = EchoProcess(tmp_path / "echo").start()
    endpoint = f"http://{echo.otlp_http}" if transport == "http" else f"grpc://{echo.otlp_grpc}"
    (tmp_path / "fleet").mkdir()
    fleet = start_fleet(
        tmp_path / "fleet",
        {"echo": {"endpoint": endpoint, "score_history_interval": "0.5s"}},
        env={"INGERO_ECHO_TOKEN": TOKEN_OPS},
    )
    try:
        nodes = [f"gpu{i:02d}" for i in range(len(HEALTHY) + 1)]
        scores = [*HEALTHY, 0.30]  # the last node straggles

        def push_round() -> None:
            pushes = [
                NodePush(n, "A", s, job_id="77", rank=i, gpu_model="H100", gpu_count=8)
                for i, (n, s) in enumerate(zip(nodes, scores, strict=True))
            ]
            assert fleet.push(pushes).status == 200

        def history() -> dict[str, int] | None:
            """Samples per node once every node has at least two (a history, not a point)."""
            push_round()  # keep every node fresh while Fleet samples
            rows = sql(echo, "SELECT node_id, sum(n) FROM scores GROUP BY node_id")
            counts = {str(node): int(n) for node, n in rows}
            return counts if len(counts) == len(nodes) and min(counts.values()) >= 2 else None

        seen = wait_for(history, 60, "every node's score samples in echo")
        assert sorted(seen) == nodes
        answer = ask(echo, "outliers", cluster_id="A", since=0)
        assert [r["node_id"] for r in answer["outliers"]] == ["gpu06"]
        outlier = answer["outliers"][0]
        assert outlier["mean_score"] == pytest.approx(0.30)
        assert outlier["cluster_median"] == pytest.approx(0.90, abs=0.01)
        # what Echo knows of each node came along with the samples
        hardware = sql(echo, "SELECT DISTINCT gpu_model, gpu_count FROM nodes")
        assert hardware == [["H100", 8]]
        job = sql(echo, "SELECT DISTINCT job_id FROM scores")
        assert job == [["77"]]
    finally:
        fleet.stop()
        echo.stop()
