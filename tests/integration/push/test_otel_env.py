"""fleet-push configured only through the OpenTelemetry SDK's OTEL_EXPORTER_OTLP_* variables,
pushing to a real Fleet that requires a bearer token (sent as an OTEL header)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.integration.push.cluster import (
    ROOT,
    Procs,
    fleet_metric,
    free_port,
    ingero,
    wait_for,
)

pytestmark = pytest.mark.integration

TOKEN = "otel-env-test-token-0123456789"


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_fleet_push_configured_only_by_otel_env_reaches_fleet(
    tmp_path: Path, protocol: str
) -> None:
    ports = {k: free_port() for k in ("otlp_grpc", "otlp_http", "api")}
    token = tmp_path / "token"
    token.write_text(TOKEN)
    fleet_cfg = tmp_path / "fleet.yaml"
    fleet_cfg.write_text(
        yaml.safe_dump(
            {
                "listen": {k: f"127.0.0.1:{p}" for k, p in ports.items()},
                "push_interval": "1s",
                "auth": {"token_file": str(token)},
            }
        )
    )
    # Nothing about where or how to push: that comes from the environment alone.
    push_cfg = tmp_path / "push.yaml"
    push_cfg.write_text(
        yaml.safe_dump(
            {
                "push_interval": "1s",
                "node_id": "otelnode",
                "cluster_id": "otel",
                "node_db": str(tmp_path / "none.db"),
                "state_dir": str(tmp_path / "state"),
                "health_state": str(tmp_path / "health.json"),
                "channels": {"journald": False, "uds": False},
            }
        )
    )
    endpoint = (
        {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{ports['otlp_http']}"}
        if protocol == "http/protobuf"
        else {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": f"127.0.0.1:{ports['otlp_grpc']}"}
    )
    env = {
        **endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer%20{TOKEN},x-site=lab",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "500",
        "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
        "INGERO_JOBS_DIR": str(tmp_path / "jobs"),
    }
    shown = subprocess.run(
        ingero("fleet-push", "--config", str(push_cfg), "--print-config"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert shown.returncode == 0, shown.stderr
    effective = yaml.safe_load(shown.stdout)
    assert effective["transport"] == ("grpc" if protocol == "grpc" else "http")
    assert effective["timeout"] == 0.5 and effective["compression"] == "gzip"
    assert effective["headers"] == {"authorization": f"Bearer {TOKEN}", "x-site": "lab"}

    procs = Procs()
    try:
        ready = tmp_path / "ready.json"
        fleet = procs.start(
            ingero("fleet", "--config", str(fleet_cfg), "--ready-file", str(ready)),
            tmp_path / "fleet.log",
        )
        wait_for(lambda: ready.exists() or fleet.poll() is not None, 60, "fleet to start")
        assert fleet.poll() is None, (tmp_path / "fleet.log").read_text()
        push = procs.start(
            ingero("fleet-push", "--config", str(push_cfg), "--workload-type", "training"),
            tmp_path / "push.log",
            env,
        )
        wait_for(
            lambda: (
                fleet_metric(ports["api"], "ingero_fleet_tracked_nodes", TOKEN) >= 1
                or push.poll() is not None
            ),
            60,
            "Fleet to track the node pushed to it via OTEL_* settings",
        )
        assert push.poll() is None, (tmp_path / "push.log").read_text()
    finally:
        procs.stop_all()


def test_precedence_flag_over_file_over_otel_env(tmp_path: Path) -> None:
    path = tmp_path / "push.yaml"
    env = {
        **os.environ,
        "INGERO_CONFIG": "",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4318",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "1000",
    }

    def effective(*flags: str) -> dict[str, object]:
        result = subprocess.run(
            ingero("fleet-push", "--config", str(path), "--print-config", *flags),
            cwd=ROOT, capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        loaded = yaml.safe_load(result.stdout)
        assert isinstance(loaded, dict)
        return loaded

    path.write_text("cluster_id: c\n")
    assert effective()["fleet_endpoint"] == "http://env:4318"
    assert effective()["timeout"] == 1.0
    path.write_text("fleet_endpoint: http://file:4318\n")
    assert effective()["fleet_endpoint"] == "http://file:4318"
    assert effective("--endpoint", "http://flag:4318")["fleet_endpoint"] == "http://flag:4318"
    # A bad value from the environment is blamed on its variable, in one line.
    env["OTEL_EXPORTER_OTLP_TIMEOUT"] = "9000"  # 9 s: not shorter than the 5 s push interval
    bad = subprocess.run(
        ingero("fleet-push", "--config", str(path), "--print-config"),
        cwd=ROOT, capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert bad.returncode == 78 and bad.stderr.count("\n") == 1, bad.stderr
