"""Decoding in worker processes: a worker that dies costs a retry, never an event; and
decoding in the daemon's own process (``decode_workers: 0``) answers the same."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from ingero.otlp.logs import encode_events

from .helpers import TOKEN_OPS, EchoProcess, straggler
from .test_daemon import grpc_export, post_logs, stored

pytestmark = pytest.mark.integration


def decoding_workers(pid: int) -> list[int]:
    """The daemon's decoding worker processes (its spawned children, not the tracker)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            ppid = (proc / "stat").read_text().rsplit(")", 1)[1].split()[1]
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue  # gone meanwhile
        if ppid == str(pid) and b"spawn_main" in cmdline:
            found.append(int(proc.name))
    return found


@pytest.fixture
def echo_with(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[EchoProcess]:
    echo = EchoProcess(tmp_path, decode_workers=request.param).start()
    try:
        yield echo
    finally:
        echo.stop()


@pytest.mark.parametrize("echo_with", [2], indirect=True)
def test_a_killed_decoding_worker_costs_a_retry_and_no_event(echo_with: EchoProcess) -> None:
    echo = echo_with
    assert echo.proc is not None
    first = [straggler(f"k{i}", "A", 5000.0 + i) for i in range(100)]
    assert post_logs(echo, encode_events(first))[0] == 200
    deadline = time.monotonic() + 30
    while len(workers := decoding_workers(echo.proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(workers) == 2, workers
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    second = encode_events([straggler(f"k{i}", "A", 6000.0 + i) for i in range(100)])
    answers = []
    while len(answers) < 5:  # what a sender does: retry what was answered 503
        status, body = post_logs(echo, second)
        answers.append((status, body.get("error") if isinstance(body, dict) else None))
        if status == 200:
            break
        assert status == 503 and "retry" in body["error"], answers
    assert answers[-1][0] == 200 and len(answers) <= 2, answers
    grpc_export(echo, encode_events([straggler("k-grpc", "A", 7000.0)]), TOKEN_OPS)
    assert stored(echo, "node_id LIKE 'k%'") == 201
    assert echo.proc.poll() is None
    assert "a decoding worker process died" in echo.log()
    assert len(decoding_workers(echo.proc.pid)) == 2  # a new pool took over


@pytest.mark.parametrize("echo_with", [0], indirect=True)
def test_decoding_in_the_daemon_process_answers_the_same(echo_with: EchoProcess) -> None:
    echo = echo_with
    assert echo.proc is not None
    assert post_logs(echo, encode_events([straggler("p1", "A", 100.0)]))[0] == 200
    grpc_export(echo, encode_events([straggler("p2", "A", 101.0)]), TOKEN_OPS)
    status, body = post_logs(echo, encode_events([straggler("p3", "A", 102.0)]), json_body=True)
    assert status == 200
    bad = encode_events([straggler("p4", "A", 103.0)])
    for kv in bad.resource_logs[0].scope_logs[0].log_records[0].attributes:
        if kv.key == "score":
            kv.value.string_value = "very low"
    status, body = post_logs(echo, bad)
    assert status == 400 and "score must be a finite number" in body["error"]
    with pytest.raises(grpc.RpcError) as err:
        grpc_export(echo, bad, TOKEN_OPS)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "score must be a finite number" in (err.value.details() or "")
    assert stored(echo, "node_id LIKE 'p%'") == 3
    assert decoding_workers(echo.proc.pid) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_decoding_workers_end_with_the_daemon(tmp_path: Path, sig: signal.Signals) -> None:
    echo = EchoProcess(tmp_path, decode_workers=2).start()
    try:
        assert echo.proc is not None
        assert post_logs(echo, encode_events([straggler("w1", "A", 100.0)]))[0] == 200
        deadline = time.monotonic() + 30
        while len(workers := decoding_workers(echo.proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(workers) == 2
    finally:
        echo.stop(sig)
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]


@pytest.mark.parametrize("echo_with", [1], indirect=True)
def test_workers_that_keep_dying_leave_decoding_to_the_daemon(echo_with: EchoProcess) -> None:
    echo = echo_with
    assert echo.proc is not None
    for death in range(3):
        deadline = time.monotonic() + 30
        while not (workers := decoding_workers(echo.proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert workers, f"no worker before death {death + 1}"
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        body = encode_events([straggler(f"d{death}", "A", 8000.0 + death)])
        statuses = [post_logs(echo, body)[0] for _ in range(2)]  # the retry is stored
        assert statuses[-1] == 200 and set(statuses) <= {200, 503}, statuses
    assert "decoding in this process from now on" in echo.log()
    assert post_logs(echo, encode_events([straggler("d-after", "A", 9000.0)]))[0] == 200
    grpc_export(echo, encode_events([straggler("d-grpc", "A", 9001.0)]), TOKEN_OPS)
    assert stored(echo, "node_id LIKE 'd%'") == 5
    assert decoding_workers(echo.proc.pid) == []
