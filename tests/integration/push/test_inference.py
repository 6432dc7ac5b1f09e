"""Inference servers as peers, on real processes.

Three stand-in vLLM servers (``tests/integration/push/fake_engine.py`` run as a console
script named ``vllm``, with ``vllm serve``'s real flags, serving vLLM-shaped ``/metrics``
over loopback), one per simulated node, each beside an ``ingero workload`` writing its node
DB and a real ``ingero fleet-push`` configured with one service name, and a real ``ingero
fleet``. Each node's fleet-push sees only its own server: its ``inference.proc_root`` holds
a link to that one process's real /proc entry.

The three replicas are one peer group (no Slurm job: the service groups them); every node
records its server in the node DB's ``engines`` table; the replica whose per-token latency
doubles is flagged a straggler through the peer ratio of ``inference_token_rate``, the two
healthy ones are not. Bad input on real processes: garbage, huge and hanging ``/metrics``
and a command line with flags no parser knows leave fleet-push pushing, each said once.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ingero.schema.events import Event
from tests.integration.push.cluster import Cluster, Procs, free_port, wait_for

pytestmark = pytest.mark.integration

NODES = 3
INTERVAL = 0.5
SERVICE = "llama-chat"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DETECT_WITHIN = 40  # push intervals; the machine is shared and slow
KV = '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}'


def vllm_script(tmp: Path) -> Path:
    """``fake_engine.py`` as an executable named ``vllm`` (a console script's shape)."""
    path = tmp / "bin" / "vllm"
    path.parent.mkdir(exist_ok=True)
    source = (Path(__file__).parent / "fake_engine.py").read_text()
    path.write_text(f"#!{sys.executable}\n{source}")
    path.chmod(0o755)
    return path


def start_engine(c: Cluster, i: int, *extra: str) -> tuple[Any, int]:
    node = c.node(i)
    port = free_port()
    argv = [
        sys.executable,
        str(vllm_script(c.tmp)),
        "serve",
        MODEL,
        "--port",
        str(port),
        "--served-model-name",
        "llama",
        "--tensor-parallel-size",
        "1",
        "--kv-transfer-config",
        KV,
        *extra,
    ]
    proc = c.procs.start(
        argv,
        c.tmp / f"{node}.engine.log",
        {"FAKE_ENGINE_CONTROL": str(c.tmp / f"{node}.engine")},
    )
    # The node's own /proc: a link to this one server's real entry.
    root = c.tmp / f"{node}.proc"
    root.mkdir(exist_ok=True)
    (root / str(proc.pid)).symlink_to(f"/proc/{proc.pid}")
    wait_for(lambda: _serves(port), 30, f"{node}'s engine to serve /metrics")
    return proc, port


def _serves(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def engine_mode(c: Cluster, i: int, mode: str) -> None:
    (c.tmp / f"{c.node(i)}.engine").write_text(mode)


def engines_rows(c: Cluster, i: int) -> list[dict[str, Any]]:
    if not (c.tmp / f"{c.node(i)}.db").exists():
        return []
    conn = sqlite3.connect(f"file:{c.tmp / f'{c.node(i)}.db'}?mode=ro", uri=True, timeout=5)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM engines ORDER BY pid")]
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()


def of(c: Cluster, kind: str, node: str) -> list[Event]:
    return [e for e in c.events() if e.type == kind and e.node_id == node]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    # Three replicas are a quorum here (a small service; Fleet's default wants five).
    c = Cluster(tmp_path, Procs(), INTERVAL, NODES, fleet_config={"quorum": {"statistical_min": 3}})
    try:
        yield c
    finally:
        c.procs.stop_all()


def push_config(c: Cluster, i: int, **inference: Any) -> None:
    c.push_config = {
        "service": SERVICE,
        "inference": {"proc_root": str(c.tmp / f"{c.node(i)}.proc"), **inference},
    }


def test_replicas_of_one_service_are_peers_and_the_slow_one_straggles(cluster: Cluster) -> None:
    c = cluster
    engine_mode(c, 0, "1.0")  # twice the per-token latency, from its first interval
    engines = [start_engine(c, i) for i in range(NODES)]
    c.start_fleet()
    c.start_sink()
    for i in range(NODES):
        c.start_workload(i)
        push_config(c, i)
        c.start_push(i)
    nodes = [c.node(i) for i in range(NODES)]
    wait_for(lambda: all("fleet" in c.modes(n) for n in nodes), 90, "every node in fleet mode")

    # Every node records its own server: engine, model, role, service.
    for i, (proc, port) in enumerate(engines):
        rows = wait_for(lambda i=i: engines_rows(c, i), 30, f"{c.node(i)}'s engines row")
        assert [
            (r["pid"], r["engine"], r["model"], r["role"], r["service"], r["metrics_url"])
            for r in rows
        ] == [(proc.pid, "vllm", "llama", "decode", SERVICE, f"http://127.0.0.1:{port}/metrics")]
        assert rows[0]["first_seen"] <= rows[0]["last_seen"]

    slow = nodes[0]
    first = wait_for(
        lambda: of(c, "straggler_state", slow),
        DETECT_WITHIN * INTERVAL,
        "the slow replica flagged",
    )[0]
    assert first.detection_mode == "fleet"
    # One peer group for the three replicas, by service (no job), and the slow one's
    # token speed is half its peers'.
    mine = c.threshold(cluster_id="itest", service=SERVICE, node_id=slow)
    assert mine["active_nodes"] == NODES
    assert mine["peer_rates"]["inference_token_rate"] == pytest.approx(1 / 0.015, rel=0.1)
    assert mine["rate_ratios"]["inference_token_rate"] == pytest.approx(0.5, abs=0.1)
    assert {e.node_id for e in c.events() if e.type == "straggler_state"} == {slow}

    # Back at its peers' speed: resolved.
    engine_mode(c, 0, "0")
    resolved = wait_for(lambda: of(c, "straggler_resolved", slow), 60, "the replica recovered")
    assert resolved[0].event_id == first.event_id
    assert {e.node_id for e in c.events() if e.type == "straggler_state"} == {slow}


def test_bad_metrics_and_unknown_flags_leave_push_running(cluster: Cluster) -> None:
    c = cluster
    c.start_fleet()
    c.start_sink()
    # One node, its server started with flags no parser knows; /metrics turns bad in turn.
    start_engine(c, 0, "--no-such-flag", "--another=1", "-x", "--speculative-config", "{")
    c.start_workload(0)
    push_config(c, 0, metrics_timeout="0.3s", max_metrics_bytes=65536)
    c.start_push(0)
    node = c.node(0)
    wait_for(lambda: engines_rows(c, 0), 60, "the engines row")
    pushes = c.fleet_metric("ingero_fleet_requests_total", signal="metrics")
    for mode, said in (
        ("garbage", "not Prometheus text"),
        ("huge", "more than 65536 bytes"),
        ("hang", "no complete answer within"),
    ):
        engine_mode(c, 0, mode)
        wait_for(lambda said=said: said in c.push_log(node), 30, f"fleet-push saying {said!r}")
        assert c.push_log(node).count(said) == 1  # once per cause, not once per push
    engine_mode(c, 0, "0")
    before = c.fleet_metric("ingero_fleet_requests_total", signal="metrics")
    assert before > pushes
    wait_for(
        lambda: c.fleet_metric("ingero_fleet_requests_total", signal="metrics") > before + 4,
        30,
        "pushes going on",
    )
    assert c.pushers[node].poll() is None
    assert "Traceback" not in c.push_log(node)
    assert os.path.exists(c.tmp / f"{node}.db")
