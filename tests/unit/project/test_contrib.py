"""contrib/: the Prometheus scrape config and rules pass promtool's checks and unit tests, and
the Grafana dashboard is well-formed dashboard JSON whose every query is valid PromQL."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
PROMETHEUS = ROOT / "contrib" / "prometheus"
DASHBOARD = ROOT / "contrib" / "grafana" / "ingero.json"
# Grafana variables, replaced by values of the right shape for promtool's parser
SUBSTITUTES = {"$__rate_interval": "1m", "$cluster": "c1", "$group": "c1/job/7", "$node": ".*"}

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed"
)


def promtool(*args: str, cwd: Path = PROMETHEUS) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


@needs_promtool
def test_rules_and_config_pass_promtool_check() -> None:
    rules = promtool("check", "rules", "ingero.rules.yml")
    assert rules.returncode == 0, rules.stdout + rules.stderr
    config = promtool("check", "config", "prometheus.yml")
    assert config.returncode == 0, config.stdout + config.stderr


@needs_promtool
def test_rule_unit_tests_pass() -> None:
    result = promtool("test", "rules", "tests/ingero.rules.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_unit_test_and_a_severity() -> None:
    groups = yaml.safe_load((PROMETHEUS / "ingero.rules.yml").read_text())["groups"]
    alerts = [r for g in groups for r in g["rules"] if "alert" in r]
    tests = yaml.safe_load((PROMETHEUS / "tests" / "ingero.rules.test.yml").read_text())["tests"]
    tested = {t["alertname"] for case in tests for t in case.get("alert_rule_test", [])}
    assert {a["alert"] for a in alerts} == tested
    assert all(a["labels"]["severity"] in ("warning", "critical") for a in alerts)
    wanted = {"IngeroStragglerOpen", "IngeroGroupPanic", "IngeroCoverageLow"}
    assert wanted | {"IngeroDrainFailing", "IngeroClockSkew"} <= tested


def dashboard() -> dict[str, Any]:
    loaded = json.loads(DASHBOARD.read_text())
    assert isinstance(loaded, dict)
    return loaded


def panel_exprs(dash: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]


def test_dashboard_is_well_formed_grafana_json() -> None:
    dash = dashboard()
    assert dash["uid"] == "ingero-overview" and dash["title"]
    assert isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert list(variables) == ["datasource", "cluster", "group", "node"]  # cluster -> job -> node
    assert variables["datasource"]["type"] == "datasource"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    known = {"row", "stat", "timeseries", "bargauge", "state-timeline", "table"}
    for p in dash["panels"]:
        assert p["type"] in known, p["title"]
        pos = p["gridPos"]
        assert pos["x"] + pos["w"] <= 24 and pos["h"] > 0, p["title"]
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            refs = [t["refId"] for t in p["targets"]]
            assert refs and len(refs) == len(set(refs)), p["title"]
    used = set(re.findall(r"\$(\w+)", json.dumps(dash)))
    assert used <= set(variables) | {"__rate_interval"}, used - set(variables)
    # the panels an operator needs: score against threshold for a job and for a node
    exprs = " ".join(e for _, e in panel_exprs(dash))
    for series in ("ingero_fleet_node_score", "ingero_fleet_threshold", "ingero_fleet_stragglers"):
        assert series in exprs


def substituted(expr: str) -> str:
    for var, value in SUBSTITUTES.items():
        expr = expr.replace(var, value)
    return expr


@needs_promtool
def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    # promtool has no bare expression check: each query becomes a recording rule
    variables = [v for v in dashboard()["templating"]["list"] if v["type"] == "query"]
    exprs = [e for _, e in panel_exprs(dashboard())]
    for var in variables:  # label_values(metric{...}, label) -> its selector
        match = re.fullmatch(r"label_values\((.*), *\w+\)", var["query"]["query"])
        assert match, var["query"]
        exprs.append(match.group(1))
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:q{i}", "expr": substituted(e)}
                    for i, e in enumerate(exprs)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump(rules))
    result = promtool("check", "rules", str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
