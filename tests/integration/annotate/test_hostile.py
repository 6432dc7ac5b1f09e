"""Hostile writers on a real ``ingero annotate serve``: lines that once killed the server or
its node DB writer, a writer flooding or hogging the socket, a writer claiming another
user's job, and a stop while a client keeps writing. Other users are real throwaway users
in a real group; their jobs are real cgroups laid out as slurmstepd lays out a job's."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ingero.annotate.codec import decode_refusal
from ingero.nodedb.window import read_latest
from ingero.nodedb.writer import Batch, NodeDbWriter
from ingero.slurm.jobfile import JobInfo, write_job
from tests.integration.annotate.helpers import ROOT, Server, annotate_server
from tests.integration.annotate.hostile import (
    PYTHON,
    WRITE,
    public_env,
    slurm_cgroups,
    throwaway_users,
)
from tests.integration.push.cluster import wait_for

pytestmark = pytest.mark.integration


def send(server: Server, *lines: bytes) -> list[str]:
    """The refusal reasons the server answered to ``lines``, sent on one connection."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(str(server.socket))
        s.sendall(b"".join(line + b"\n" for line in lines))
        s.shutdown(socket.SHUT_WR)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except ConnectionResetError:
            pass
    return [decode_refusal(line)[0] for line in out.splitlines()]


def steps(server: Server) -> list[int]:
    return [m["step"] for m in server.marks() if m["kind"] == "step"]


def test_a_huge_or_infinite_ts_is_refused_and_the_server_serves_on(tmp_path: Path) -> None:
    """A 400-digit integer ts once raised OverflowError out of the server (exit 70)."""
    with annotate_server(tmp_path) as server:
        refused = send(
            server,
            b'{"kind":"step","step":1,"ts":' + b"9" * 400 + b"}",
            b'{"kind":"step","step":1,"ts":-' + b"9" * 400 + b".5}",
            b'{"kind":"step","step":1,"ts":1e999}',
            b'{"kind":"label","name":"x","labels":{"n":' + b"9" * 30 + b"}}",
            b'{"kind":"step","step":1}',
        )
        assert server.proc.poll() is None, server.log.read_text()
        assert send(server, b'{"kind":"step","step":2}') == []
        log = server.stop()
    assert refused == ["bad_line"] * 4
    assert steps(server) == [1, 2]
    assert "refused 4 bad_line" in log


def test_a_lone_surrogate_is_refused_and_every_later_mark_is_written(tmp_path: Path) -> None:
    """JSON can spell a lone surrogate (\\ud800), which SQLite cannot store: accepted, it
    killed the node DB writer's thread and no later mark of any writer was written."""
    with annotate_server(tmp_path) as server:
        refused = send(
            server,
            b'{"kind":"label","name":"\\ud800"}',
            b'{"kind":"label","name":"x","labels":{"k":"a\\udfff"}}',
            b'{"kind":"label","name":"x","labels":{"\\ud83d":1}}',
            b'{"kind":"phase","name":"\\udc00x","state":"begin"}',
        )
        assert send(server, b'{"kind":"step","step":7}') == []
        wait_for(lambda: steps(server) == [7], 30, "a later mark in the node DB")
        log = server.stop()
    assert refused == ["bad_line"] * 4
    assert "refused 4 bad_line" in log


RECONNECT = """
import socket, sys
for _ in range(10):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    s.sendall(b'{"kind":"step"}\\n' * 200)
    s.shutdown(socket.SHUT_WR)
    while s.recv(65536):
        pass
    s.close()
"""


def test_reconnecting_does_not_refill_the_rate_bucket(tmp_path: Path) -> None:
    """10 x (connect, 200 lines, close) from one pid: each connection had a fresh bucket."""
    with annotate_server(tmp_path, "--lines-per-s", "0.1", "--burst", "50") as server:
        subprocess.run([sys.executable, "-c", RECONNECT, str(server.socket)],
                       check=True, timeout=120)  # fmt: skip
        server.stop()
    # The bucket holds 50 and refills at one line per 10 s: 50, a few more on a slow run.
    assert 50 <= len(steps(server)) < 100


def test_new_processes_of_one_user_share_its_bucket(tmp_path: Path) -> None:
    """A writer that forks a new pid per burst draws on its user's bucket too."""
    extra = ("--uid-lines-per-s", "0.1", "--uid-burst", "100")
    with annotate_server(tmp_path, *extra) as server:
        for _ in range(5):  # five processes, each within its own pid's burst of 200
            code = RECONNECT.replace("range(10)", "range(1)")
            subprocess.run([sys.executable, "-c", code, str(server.socket)],
                           check=True, timeout=120)  # fmt: skip
        log = server.stop()
    assert 100 <= len(steps(server)) < 150
    assert "rate" in log


# One user's process opens many connections and holds them: half sit inside a line.
HOG = """
import socket, sys
held = []
for i in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    if i % 2:
        s.sendall(b'{"kind":"st')
    held.append(s)
print("connected", len(held), flush=True)
sys.stdin.readline()
"""


def test_one_user_cannot_hold_every_client_slot(tmp_path: Path, public_dir: Path) -> None:
    """With --group, 64 idle or half-line connections from one process filled the server's
    64 clients: every other user was refused until that process let go."""
    with throwaway_users(2) as users:
        hog_user, other = users.names
        sock = public_dir / "a.sock"
        with annotate_server(tmp_path, "--socket", str(sock), "--group", users.group) as server:
            hog = subprocess.Popen(
                users.argv(hog_user, PYTHON, "-c", HOG, str(sock), "64"),
                env=public_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            try:
                assert hog.stdout is not None and hog.stdin is not None
                assert hog.stdout.readline().split() == ["connected", "64"]
                line = json.dumps({"kind": "step", "step": 5})
                done = subprocess.run(
                    users.argv(other, PYTHON, "-c", WRITE, str(sock), line),
                    env=public_env(), capture_output=True, text=True, timeout=60, check=False,
                )  # fmt: skip
            finally:
                if hog.stdin is not None:
                    hog.stdin.close()
                hog.wait(timeout=60)
            log = server.stop()
    assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr
    assert [(m["uid"], m["step"]) for m in server.marks()] == [(users.uids[other], 5)]
    assert "clients" in log  # the hog's connections beyond its user's share were refused


def test_a_half_line_or_a_silent_connection_is_closed_after_its_timeout(
    tmp_path: Path,
) -> None:
    with annotate_server(tmp_path, "--idle-s", "1", "--line-timeout-s", "0.3") as server:
        half = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        answers = {}
        with half, silent:
            for s in (half, silent):
                s.settimeout(30)
                s.connect(str(server.socket))
            half.sendall(b'{"kind":"st')
            for name, s in (("half", half), ("silent", silent)):
                out = b""
                while chunk := s.recv(65536):  # the server closes it: EOF, not the timeout
                    out += chunk
                answers[name] = [decode_refusal(line) for line in out.splitlines()]
        assert send(server, b'{"kind":"step","step":3}') == []  # serving on
        log = server.stop()
    assert [r for r, _ in answers["half"]] == ["idle"] and "line" in answers["half"][0][1]
    assert [r for r, _ in answers["silent"]] == ["idle"]
    assert steps(server) == [3]
    assert "2 idle" in log


def job_id(n: int) -> str:
    """A job id no real job on this host holds (its cgroup is made here)."""
    return str(9_000_000 + (os.getpid() % 100_000) * 10 + n)


def test_with_group_a_writer_cannot_write_as_another_users_job(
    tmp_path: Path, public_dir: Path
) -> None:
    """The job and rank came from the writer's own environment, which it sets itself. The
    job now comes from the writer's Slurm cgroup (root's, not the writer's) checked against
    the prolog's job file; the environment is believed only for the server's own user."""
    with throwaway_users(3) as users, slurm_cgroups() as cgroups:
        a, b, c = users.names
        mine, theirs = job_id(1), job_id(2)
        jobs = tmp_path / "jobs"
        for job, user, rank in ((mine, a, 0), (theirs, b, 1)):
            write_job(jobs, JobInfo(job, "c", "n1", rank, 2, ["n0", "n1"], user,
                                    users.uids[user]))  # fmt: skip
        sock = public_dir / "a.sock"
        env = {"INGERO_JOBS_DIR": str(jobs)}
        argv = ("--socket", str(sock), "--group", users.group)
        with annotate_server(tmp_path, *argv, env=env) as server:

            def write(user: str, leaf: Path | None, claim: str, rank: str, n: int) -> None:
                lines = [json.dumps({"kind": "step", "step": i}) for i in range(n)]
                command = users.argv(user, "env", f"SLURM_JOB_ID={claim}",
                                     f"SLURM_PROCID={rank}", PYTHON, "-c", WRITE, str(sock),
                                     *lines)  # fmt: skip
                if leaf is not None:
                    command = cgroups.argv(leaf, *command)
                done = subprocess.run(command, env=public_env(), capture_output=True,
                                      text=True, timeout=60, check=False)  # fmt: skip
                assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr

            # a: its own job, in its job's cgroup (v2), its rank from its own environment
            write(a, cgroups.leaf(2, mine, users.uids[a]), mine, "3", 4)
            # b: in its own job's cgroup (v1), claiming a's job and rank 0
            write(b, cgroups.leaf(1, theirs, users.uids[b]), mine, "0", 5)
            # c: outside Slurm, claiming a's job
            write(c, None, mine, "0", 6)
            server.stop()
    tags = {(m["uid"], m["job_id"], m["rank"]) for m in server.marks()}
    assert tags == {
        (users.uids[a], mine, 3),
        (users.uids[b], theirs, 1),  # its job's, and the job file's rank (its claim ignored)
        (users.uids[c], None, None),
    }
    rows = server.rows("SELECT uid, job_id, SUM(count) AS n FROM intervals GROUP BY uid")
    assert {(r["uid"], r["job_id"], r["n"]) for r in rows} == {
        (users.uids[a], mine, 4),
        (users.uids[b], theirs, 5),
        (users.uids[c], None, 6),
    }
    # fleet-push pushing a's job counts a's steps only (it summed all three: 15). The
    # tracer's interval over the same time is what the window is measured on.
    end = max(r["ts_end"] for r in server.rows("SELECT ts_end FROM intervals"))
    tracer = NodeDbWriter(server.db)
    tracer.submit(Batch(host_intervals=[{"ts_start": end - 60, "ts_end": end + 1}]))
    tracer.start()
    tracer.close()
    assert read_latest(server.db, end + 2, 120, None, job_id=mine).steps == 4
    assert read_latest(server.db, end + 2, 120, None, job_id=theirs).steps == 5


FLOOD = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
print("connected", flush=True)
try:
    while True:
        s.sendall(b'{"kind":"step"}\\n' * 100)
except OSError:
    pass
"""


def test_sigterm_finishes_while_a_client_keeps_writing(tmp_path: Path) -> None:
    """The drain read each connection until it had nothing more: a client that never
    stopped writing kept the server from stopping until systemd's SIGKILL lost its marks."""
    extra = ("--lines-per-s", "1000000", "--burst", "1000000")
    with annotate_server(tmp_path, *extra) as server:
        flood = subprocess.Popen(
            [sys.executable, "-c", FLOOD, str(server.socket)], cwd=ROOT, stdout=subprocess.PIPE
        )
        try:
            assert flood.stdout is not None and flood.stdout.readline() == b"connected\n"
            wait_for(lambda: len(steps(server)) > 1000, 60, "the flood's marks written")
            server.proc.send_signal(signal.SIGTERM)
            try:
                code = server.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pytest.fail("the server did not stop within 60 s of SIGTERM")
        finally:
            flood.kill()
            flood.wait()
        log = server.log.read_text()
    assert code == 0, log
    # Everything accepted before the drain's deadline is in the node DB.
    accepted = int(log.split("ingero annotate: accepted ")[1].split()[0])
    assert accepted > 1000 and len(steps(server)) == accepted
