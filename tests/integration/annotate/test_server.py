"""``ingero annotate serve`` on a real socket: client processes, SO_PEERCRED, every refusal,
owner-only and group access, marks in the node DB."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.annotate.helpers import ROOT, Server, annotate_server
from tests.integration.annotate.hostile import WRITE
from tests.integration.push.cluster import wait_for
from tests.integration.signals import signal_storm

pytestmark = pytest.mark.integration

CLIENT = """
import sys
from ingero.annotate.client import Annotator
a = Annotator(sys.argv[1])
with a.span("checkpoint", {"path": "/ckpt/7"}):
    for i in range(5):
        a.step(i)
a.label("dataset", {"shard": 7, "lr": 0.1, "warm": True})
a.close()
print(a.sent, a.dropped)
"""


def send(server: Server, *lines: bytes) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "ingero.cli.main", "annotate", "send"]
    return subprocess.run(
        [*argv, "--socket", str(server.socket)],
        input=b"".join(line + b"\n" for line in lines).decode(errors="surrogateescape"),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def test_a_client_process_marks_with_its_kernel_identity(tmp_path: Path) -> None:
    with annotate_server(tmp_path) as server:
        env = {**os.environ, "SLURM_JOB_ID": "77", "SLURM_PROCID": "2"}
        proc = subprocess.run(
            [sys.executable, "-c", CLIENT, str(server.socket)],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        assert proc.stdout.split() == ["8", "0"]
        # A line may not claim a pid: the server answers and keeps serving.
        refused = send(server, b'{"kind":"step","pid":1}', b'{"kind":"step","step":9}')
        log = server.stop()
    assert refused.returncode == 65
    assert "refused (bad_line): unknown field 'pid'" in refused.stderr
    marks = server.marks()
    client = [m for m in marks if m["job_id"] == "77"]
    assert {(m["uid"], m["rank"]) for m in client} == {(0, 2)}
    assert len({m["pid"] for m in client}) == 1 and client[0]["pid"] != os.getpid()
    assert [(m["kind"], m["name"], m["step"]) for m in client] == [
        ("phase", "checkpoint", None),
        *[("step", "step", i) for i in range(5)],
        ("label", "dataset", None),
    ]
    phase = client[0]
    assert phase["ts_end"] is not None and phase["ts_end"] >= client[5]["ts_start"]
    assert json.loads(client[6]["labels"]) == {"shard": 7, "lr": 0.1, "warm": True}
    assert [m["step"] for m in marks if m["job_id"] is None] == [9]
    steps = server.rows("SELECT pid, source, SUM(count) AS n FROM intervals GROUP BY pid")
    assert sorted(s["n"] for s in steps) == [1, 5]
    assert {s["source"] for s in steps} == {"annotate"}
    assert "refused 1 bad_line" in log


def test_every_refusal_answered_and_the_server_keeps_serving(tmp_path: Path) -> None:
    labels = {f"k{i}": i for i in range(17)}
    with annotate_server(tmp_path, "--lines-per-s", "0.1", "--burst", "8") as server:
        result = send(
            server,
            b"x" * 5000,
            b"{not json",
            b'{"kind":"label","name":"x","labels":' + json.dumps(labels).encode() + b"}",
            b'{"kind":"label","name":"x","labels":{"k":"' + b"v" * 300 + b'"}}',
            b'{"kind":"phase","name":"ckpt","state":"end"}',
            b'{"kind":"step","ts":1000.0}',
            b'{"kind":"step","step":1}',
            b'{"kind":"step","step":2}',
            b'{"kind":"step","step":3}',  # the ninth line in a burst of 8
        )
        after = send(server, b'{"kind":"label","name":"still","labels":{}}')
        log = server.stop()
    reasons = [line.split("(")[1].split(")")[0] for line in result.stderr.splitlines()]
    assert reasons == ["too_long", "bad_json", "too_many_labels", "too_big", "phase", "clock",
                       "rate"]  # fmt: skip
    assert result.returncode == 65
    # The rate bucket is empty for that writer, but a new process is a new writer.
    assert after.returncode == 0, after.stderr
    assert [(m["kind"], m["step"]) for m in server.marks()] == [
        ("step", 1),
        ("step", 2),
        ("label", None),
    ]
    assert (
        "refused 1 bad_json, 1 clock, 1 phase, 1 rate, 1 too_big, 1 too_long, 1 too_many_labels"
        in log
    )


def test_clients_over_the_bound_are_refused(tmp_path: Path) -> None:
    with annotate_server(tmp_path, "--max-clients", "1") as server:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as held:
            held.connect(str(server.socket))
            held.sendall(b'{"kind":"step"}\n')
            # Held: its mark is written, so the server counts it as a client.
            wait_for(lambda: server.marks(), 60, "the held connection's mark")
            result = send(server, b'{"kind":"step"}')
            assert result.returncode == 65
            assert "refused (clients): at most 1 clients" in result.stderr
        server.stop()
    assert len(server.marks()) == 1


def run_as_nobody(sock: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
         "/usr/bin/python3", "-c", WRITE, str(sock), '{"kind":"step","step":1}'],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root")
def test_owner_only_by_default_another_user_is_denied(tmp_path: Path, public_dir: Path) -> None:
    with annotate_server(tmp_path, "--socket", str(public_dir / "a.sock")) as server:
        sock = public_dir / "a.sock"
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600
        result = run_as_nobody(sock)
        server.stop()
    assert result.returncode == 3 and result.stdout.split() == ["connect", "failed", "13"]  # EACCES
    assert server.marks() == []


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root")
def test_a_configured_group_may_write(tmp_path: Path, public_dir: Path) -> None:
    sock = public_dir / "a.sock"
    with annotate_server(tmp_path, "--socket", str(sock), "--group", "nogroup") as server:
        assert stat.S_IMODE(sock.stat().st_mode) == 0o660
        result = run_as_nobody(sock)
        server.stop()
    assert result.returncode == 0 and result.stdout == "", result.stdout + result.stderr
    assert [(m["uid"], m["step"]) for m in server.marks()] == [(65534, 1)]


def test_a_second_server_on_a_live_socket_exits_and_a_stale_one_is_replaced(
    tmp_path: Path,
) -> None:
    with annotate_server(tmp_path) as server:
        second = subprocess.run(
            [sys.executable, "-m", "ingero.cli.main", "annotate", "serve", "--socket",
             str(server.socket), "--db", str(tmp_path / "other.db")],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert second.returncode == 69
        assert "another annotate server is listening" in second.stderr
        assert send(server, b'{"kind":"step"}').returncode == 0  # the first one serves on
        server.stop()
    # A server killed outright leaves its socket file: the next one replaces it.
    again = tmp_path / "again"
    again.mkdir()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(again / "annotate.sock"))
    stale.close()
    with annotate_server(again) as replaced:
        assert send(replaced, b'{"kind":"step"}').returncode == 0


def test_a_storm_of_stop_signals_stops_the_server_once(tmp_path: Path) -> None:
    """SIGTERM after SIGTERM (a supervisor repeating its signal, Ctrl-C after systemctl stop):
    the server stops once, cleanly, with what a writer sent. A handler that took a lock
    deadlocked here when a signal landed while the main thread held it."""
    with annotate_server(tmp_path) as server:
        assert send(server, b'{"kind":"step","step":9}').returncode == 0
        sent = signal_storm(server.proc)
        assert server.proc.wait(timeout=30) == 0, (sent, server.log.read_text())
        assert [m["step"] for m in server.marks()] == [9]
