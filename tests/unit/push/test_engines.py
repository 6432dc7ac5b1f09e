"""fleet-push's inference servers: the node DB's ``engines`` rows, the node's inference rates,
and the service that groups replicas through the health push and Fleet's group key."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from ingero.collectors.engines import MetricsError
from ingero.nodedb import schema
from ingero.otlp.health import (
    INFERENCE_STEP_RATE,
    INFERENCE_TOKEN_RATE,
    NodePush,
    decode_health,
    encode_health,
    group_key,
)
from ingero.push.engines import EngineWatcher
from ingero.runtime.clock import ManualClock

PY = "/opt/venv/bin/python3"


def proc(root: Path, pid: int, *argv: str) -> None:
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")


def vllm_text(tokens: float, latency_sum: float) -> str:
    return (
        "# TYPE vllm:inter_token_latency_seconds histogram\n"
        f'vllm:inter_token_latency_seconds_sum{{model_name="llama"}} {latency_sum}\n'
        f'vllm:inter_token_latency_seconds_count{{model_name="llama"}} {tokens}\n'
    )


class Server:
    """What each URL answers (text, or an error), as the real fetch would."""

    def __init__(self) -> None:
        self.answers: dict[str, str | MetricsError] = {}

    def fetch(self, url: str, timeout_s: float, max_bytes: int) -> str:
        answer = self.answers.get(url, MetricsError(f"{url}: connection refused"))
        if isinstance(answer, MetricsError):
            raise answer
        return answer


def rows(db: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(db) as conn:
        return list(
            conn.execute(
                "SELECT pid, engine, model, role, service, metrics_url, job_id, rank,"
                " first_seen, last_seen FROM engines ORDER BY pid"
            )
        )


@pytest.fixture
def node(tmp_path: Path) -> tuple[Path, Path]:
    db = tmp_path / "node.db"
    schema.connect(db).conn.close()  # the tracer creates it, at the current version
    return tmp_path / "proc", db


def test_rows_rates_and_derived_service(node: tuple[Path, Path]) -> None:
    root, db = node
    proc(root, 40, PY, "/v/bin/vllm", "serve", "/models/l", "--served-model-name", "llama")
    proc(root, 41, "bash")
    server, clock = Server(), ManualClock()
    url = "http://127.0.0.1:8000/metrics"
    server.answers[url] = vllm_text(1000, 20.0)
    w = EngineWatcher(db_path=db, clock=clock, proc_root=root, fetch=server.fetch)
    w.tags = ("77", 3)
    assert w.observe() == {}  # one reading: no interval yet
    t0 = clock.now()
    assert rows(db) == [(40, "vllm", "llama", "mixed", "llama", url, "77", 3, t0, t0)]
    clock.advance(5)
    server.answers[url] = vllm_text(3000, 60.0)  # 2000 tokens at 20 ms
    assert w.observe() == {INFERENCE_TOKEN_RATE: pytest.approx(50.0)}
    assert rows(db)[0][-2:] == (t0, t0 + 5)  # first_seen kept, last_seen moves
    assert w.service == "llama"  # the one model served here, none configured

    # A second model on the node: no derived service; a configured one always wins.
    proc(root, 42, "python3", "-m", "sglang.launch_server", "--model-path", "qwen")
    w.observe()
    assert w.service is None
    w.configured = "chat"
    w.observe()
    assert {r[4] for r in rows(db)} == {"chat"}

    # The server exits: its rates go, its row stays with its last_seen.
    for pid in (40, 42):
        (root / str(pid) / "cmdline").unlink()
        (root / str(pid)).rmdir()
    clock.advance(5)
    assert w.observe() == {}
    assert rows(db)[0][-1] == t0 + 5  # when it was last seen


def test_tgi_steps_and_the_median_of_the_nodes_servers(node: tuple[Path, Path]) -> None:
    root, db = node
    server, clock = Server(), ManualClock()
    for pid, port in ((50, 9001), (51, 9002), (52, 9003)):
        proc(
            root, pid, "text-generation-launcher", "--model-id", "m", "--prometheus-port", str(port)
        )
        server.answers[f"http://127.0.0.1:{port}/metrics"] = ""
    w = EngineWatcher(db_path=db, clock=clock, proc_root=root, fetch=server.fetch)
    w.observe()
    for port, step in ((9001, 0.02), (9002, 0.04), (9003, 0.05)):
        server.answers[f"http://127.0.0.1:{port}/metrics"] = (
            "# TYPE tgi_batch_forward_duration histogram\n"
            f'tgi_batch_forward_duration_sum{{method="decode"}} {100 * step}\n'
            'tgi_batch_forward_duration_count{method="decode"} 100\n'
        )
    clock.advance(1)
    w.observe()  # from nothing to the first totals: a reset-free first interval
    clock.advance(1)
    for port, step in ((9001, 0.02), (9002, 0.04), (9003, 0.05)):
        server.answers[f"http://127.0.0.1:{port}/metrics"] = (
            "# TYPE tgi_batch_forward_duration histogram\n"
            f'tgi_batch_forward_duration_sum{{method="decode"}} {200 * step}\n'
            'tgi_batch_forward_duration_count{method="decode"} 200\n'
        )
    assert w.observe() == {INFERENCE_STEP_RATE: pytest.approx(25.0)}  # median of 50, 25, 20


def test_bad_metrics_and_an_old_node_db_are_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root, db = tmp_path / "proc", tmp_path / "node.db"
    proc(root, 60, "tritonserver", "--model-repository=/models/r")
    with sqlite3.connect(db) as conn:  # a version-4 node DB: no engines table
        conn.execute("PRAGMA user_version = 4")
    server, clock = Server(), ManualClock()
    w = EngineWatcher(db_path=db, clock=clock, proc_root=root, fetch=server.fetch)
    caplog.set_level(logging.WARNING, "ingero.push.engines")
    for _ in range(3):
        assert w.observe() == {}
        clock.advance(1)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert "connection refused" in said[0] and "has no engines table" in said[1]
    # Not created or migrated from here: the tracer owns the schema.
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 4
    # Triton's /metrics that shows the TensorRT-LLM backend makes it trtllm.
    server.answers["http://127.0.0.1:8002/metrics"] = (
        '# TYPE nv_trt_llm_request_metrics gauge\nnv_trt_llm_request_metrics{model="m"} 1\n'
    )
    w.observe()
    assert w.summary()[60].engine == "trtllm"
    w2 = EngineWatcher(db_path=tmp_path / "none.db", clock=clock, proc_root=root)
    w2.observe()  # no node DB at all: said, nothing created
    assert not (tmp_path / "none.db").exists()


def test_service_travels_in_the_push_and_groups_without_a_job() -> None:
    push = NodePush("n1", "c1", 0.9, service="llama-chat", workload_type="inference")
    decoded = decode_health(encode_health(push, 1)).pushes[0]
    assert decoded.service == "llama-chat"
    assert decoded.group == "c1/service/llama-chat"
    assert group_key("c1", "77", "inference", "llama-chat") == "c1/job/77"  # the job first
    assert group_key("c1", None, "inference", None) == "c1/workload/inference"
    assert decode_health(encode_health(NodePush("n1", "c1", 0.9), 1)).pushes[0].service is None


def test_rows_of_exited_servers_are_bounded(
    node: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, db = node
    monkeypatch.setattr("ingero.push.engines.MAX_ENGINE_ROWS", 3)
    clock = ManualClock()
    w = EngineWatcher(db_path=db, clock=clock, proc_root=root, fetch=Server().fetch)
    for pid in range(100, 106):  # one server at a time, each exits before the next
        proc(root, pid, "tritonserver", "--model-repository=/m")
        w.observe()
        (root / str(pid) / "cmdline").unlink()
        (root / str(pid)).rmdir()
        clock.advance(1)
    assert [r[0] for r in rows(db)] == [103, 104, 105]


def test_hanging_servers_share_one_budget_per_push(
    node: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """Each read here takes its whole timeout (a hanging server): after two of them the
    others wait for the next push instead of costing one timeout each."""
    root, db = node
    clock = ManualClock()
    read: list[str] = []

    def hanging(url: str, timeout_s: float, max_bytes: int) -> str:
        read.append(url)
        clock.advance(timeout_s)
        raise MetricsError(f"{url}: no complete answer within {timeout_s:g} s")

    for pid in range(70, 75):
        proc(root, pid, "tritonserver", "--model-repository=/m", f"--metrics-port={9000 + pid}")
    w = EngineWatcher(db_path=db, clock=clock, proc_root=root, timeout_s=1.0, fetch=hanging)
    caplog.set_level(logging.WARNING, "ingero.push.engines")
    w.observe()
    assert len(read) == 2
    assert any("took their budget" in r.getMessage() for r in caplog.records)
    assert len(rows(db)) == 5  # every server is still recorded
    for _ in range(4):
        w.observe()
    assert len(set(read)) == 5  # the next pushes start further on: every server is read


def test_a_router_serves_no_model(node: tuple[Path, Path]) -> None:
    """A router passes requests on: it is recorded, but not a server whose steps or model
    count (its tree is not measured, it names no service, it makes no node a server)."""
    root, db = node
    proc(root, 60, PY, "-m", "sglang_router.launch_router", "--model", "qwen")
    w = EngineWatcher(db_path=db, clock=ManualClock(), proc_root=root, fetch=Server().fetch)
    w.observe()
    assert set(w.summary()) == {60} and w.serving() == {} and w.trees() == {}
    proc(root, 61, PY, "/v/bin/vllm", "serve", "llama")
    w.observe()
    assert set(w.serving()) == set(w.trees()) == {61}
    assert w.service == "llama"
