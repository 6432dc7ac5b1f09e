"""/metrics as Prometheus sees it. Fleet, sink and Echo: promtool-clean, HEAD answered, build
info, no _created series, Fleet's opt-in per-node series bounded. Then a real Prometheus
(Debian's package) on loopback scrapes a running Fleet with contrib/'s rules loaded: the series
arrive, the rules evaluate without error, an alert goes pending, and every query of the
contrib/ Grafana dashboard returns data."""

from __future__ import annotations

import http.client
import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from ingero import __version__
from ingero.otlp.health import NodePush
from tests.integration.echo.helpers import EchoProcess
from tests.integration.fleet.helpers import Fleet, start_fleet, wait_for
from tests.integration.push.cluster import Procs, free_port, ingero

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "contrib" / "prometheus" / "ingero.rules.yml"
DASHBOARD = ROOT / "contrib" / "grafana" / "ingero.json"
SCORES = {"n1": 0.90, "n2": 0.91, "n3": 0.30, "n4": 0.92, "n5": 0.89}  # n3 straggles
VARIABLES = {"$__rate_interval": "1m", "$cluster": "c1", "$group": "c1/job/7", "$node": ".*"}


def promtool_check(body: bytes) -> str:
    """promtool's complaints about a /metrics body ('' when clean)."""
    if shutil.which("promtool") is None:
        pytest.skip("promtool (Debian package prometheus) not installed")
    result = subprocess.run(
        ["promtool", "check", "metrics"], input=body, capture_output=True, timeout=60, check=False
    )
    return (result.stdout + result.stderr).decode() + ("" if result.returncode == 0 else "!")


def fetch(address: str, method: str = "GET", path: str = "/metrics") -> tuple[int, int, bytes]:
    """(status, Content-Length, body) of one request."""
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, int(resp.getheader("Content-Length") or -1), resp.read()
    finally:
        conn.close()


def families(body: bytes) -> dict[str, list[Any]]:
    return {f.name: f.samples for f in text_string_to_metric_families(body.decode())}


def assert_prometheus_clean(address: str, daemon: str) -> dict[str, list[Any]]:
    status, _, body = fetch(address)
    assert status == 200
    assert promtool_check(body) == "", daemon
    assert b"_created" not in body
    found = families(body)
    (info,) = found["ingero_build_info"]
    assert info.labels["daemon"] == daemon and info.labels["version"] == __version__
    head_status, length, head_body = fetch(address, "HEAD")
    assert (head_status, head_body) == (200, b"") and length > 0
    return found


def push_job(fleet: Fleet) -> None:
    reply = fleet.push(
        NodePush(node_id=n, cluster_id="c1", score=s, job_id="7", rank=i, world_size=5)
        for i, (n, s) in enumerate(SCORES.items())
    )
    assert reply.status == 200, reply


def test_every_metrics_endpoint_is_promtool_clean(tmp_path: Path, procs: Procs) -> None:
    (tmp_path / "fleet").mkdir()
    fleet = start_fleet(
        tmp_path / "fleet",
        {
            "metrics": {"node_series": True, "node_series_limit": 3},
            "quorum": {"statistical_min": 3},
        },
    )
    try:
        push_job(fleet)
        wait_for(lambda: fleet.metric("ingero_fleet_node_score") > 0, 30, "node series")
        wait_for(lambda: fleet.metric("ingero_fleet_stragglers") == 1, 30, "the straggler")
        found = assert_prometheus_clean(fleet.api, "fleet")
        # three nodes of five: the straggler first, then the lowest scores
        shown = {s.labels["node_id"] for s in found["ingero_fleet_node_score"]}
        assert shown == {"n3", "n5", "n1"}
        assert found["ingero_fleet_node_series_omitted"][0].value == 2
        straggling = {s.labels["node_id"] for s in found["ingero_fleet_node_straggler"] if s.value}
        assert straggling == {"n3"}
        assert {s.labels["job_id"] for s in found["ingero_fleet_node_score"]} == {"7"}
        assert "ingero_fleet_straggler_count" not in found  # renamed: promtool refused it
    finally:
        assert fleet.stop() == 0

    port = free_port()
    sock = tmp_path / "events.sock"
    procs.start(
        ingero("sink", "--socket", str(sock), "--metrics", f"127.0.0.1:{port}"),
        tmp_path / "sink.log",
    )
    wait_for(lambda: _answers(f"127.0.0.1:{port}"), 30, "the sink's /metrics")
    assert_prometheus_clean(f"127.0.0.1:{port}", "sink")

    (tmp_path / "echo").mkdir()
    echo = EchoProcess(tmp_path / "echo", tokens=False).start()
    try:
        assert_prometheus_clean(echo.api, "echo")
    finally:
        echo.stop()


def _answers(address: str, path: str = "/metrics") -> bool:
    try:
        return fetch(address, path=path)[0] == 200
    except OSError:
        return False


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as resp:
            reply = json.load(resp)
        assert reply["status"] == "success", reply
        return reply["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result


def test_a_real_prometheus_scrapes_fleet_and_runs_the_contrib_rules(
    tmp_path: Path, procs: Procs
) -> None:
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus (Debian package) not installed")
    fleet = start_fleet(
        tmp_path, {"metrics": {"node_series": True}, "quorum": {"statistical_min": 3}}
    )
    try:
        push_job(fleet)
        # one refused push, so the dashboard's refusals panel has a series too
        assert fleet.post_metrics(b"not protobuf", "application/x-protobuf").status == 400
        port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {"job_name": "ingero-fleet", "static_configs": [{"targets": [fleet.api]}]}
            ],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        procs.start(
            [
                "prometheus",
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            tmp_path / "prometheus.log",
        )
        prom = Prometheus(f"http://127.0.0.1:{port}")
        wait_for(lambda: _answers(f"127.0.0.1:{port}", "/-/ready"), 60, "prometheus to be ready")

        (info,) = wait_for(lambda: prom.query("ingero_build_info"), 60, "a scrape")
        assert info["metric"]["daemon"] == "fleet" and info["metric"]["version"] == __version__
        scores = wait_for(lambda: prom.query("ingero_fleet_node_score"), 30, "node series")
        assert {s["metric"]["node_id"] for s in scores} == set(SCORES)

        # recording rules evaluate to what Fleet reports; no rule fails
        recorded = wait_for(
            lambda: prom.query('cluster:ingero_stragglers:sum{cluster_id="c1"} == 1'),
            60,
            "the straggler count recording rule",
        )
        assert recorded[0]["value"][1] == "1"
        margins = prom.query('node:ingero_score_margin:diff{node_id="n3"}')
        assert float(margins[0]["value"][1]) < 0  # below its group's threshold
        rules = [r for g in prom.get("/api/v1/rules")["groups"] for r in g["rules"]]
        assert len(rules) == 18 and {r["health"] for r in rules} == {"ok"}, rules
        # the straggler alert is pending (it fires after 10 minutes)
        alerts = wait_for(
            lambda: [a for a in prom.get("/api/v1/alerts")["alerts"] if a["state"] == "pending"],
            30,
            "a pending alert",
        )
        assert {a["labels"]["alertname"] for a in alerts} >= {"IngeroStragglerOpen"}

        # the dashboard: its variables list this cluster, job and nodes ...
        for label, match, want in (
            ("cluster_id", "ingero_fleet_active_nodes", {"c1"}),
            ("group", 'ingero_fleet_active_nodes{cluster_id="c1"}', {"c1/job/7"}),
            ("node_id", 'ingero_fleet_node_score{cluster_id="c1", group="c1/job/7"}', set(SCORES)),
        ):
            assert set(prom.get(f"/api/v1/label/{label}/values", **{"match[]": match})) == want
        # ... and every panel's query has data once two scrapes are in a rate window
        dashboard = json.loads(DASHBOARD.read_text())
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"]
                for var, value in VARIABLES.items():
                    expr = expr.replace(var, value)
                wait_for(lambda e=expr: prom.query(e), 30, f"data for {panel['title']!r}: {expr}")
    finally:
        assert fleet.stop() == 0
