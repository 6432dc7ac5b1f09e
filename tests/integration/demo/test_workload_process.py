"""``ingero workload`` as a process: writes the node DB, SIGUSR1 and the control file slow it."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ingero.nodedb.window import NodeDbUnavailable, read_window

pytestmark = pytest.mark.integration


def start(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ingero.cli.main", "workload", "--db", str(tmp_path / "n.db"),
         "--interval", "0.1", "--noise", "0.01", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip


def rate_since(path: Path, since: float, rows: int = 5) -> float:
    """Launch rate over the first ``rows`` intervals that began after ``since`` (waits for them).

    Each interval's count reflects its own length, so the result does not depend on how
    promptly a loaded machine ran the workload.
    """
    deadline = time.monotonic() + 60
    while True:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            got = conn.execute(
                "SELECT count, ts_end - ts_start FROM intervals WHERE op = 'cuLaunchKernel' "
                "AND ts_start >= ? ORDER BY ts_start LIMIT ?",
                (since, rows + 1),
            ).fetchall()
        finally:
            conn.close()
        if len(got) > rows:
            got = got[1:]  # the first may have started before the change took effect
            return sum(c for c, _ in got) / sum(d for _, d in got)
        assert time.monotonic() < deadline, "the workload stopped writing"
        time.sleep(0.1)


def stop(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    return out


def wait_for_db(path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(NodeDbUnavailable):  # created but not yet migrated
            if read_window(path, time.time(), 1.0).kernel_launches > 0:
                return
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_sigusr1_toggles_the_slowdown(tmp_path: Path) -> None:
    proc = start(tmp_path, "--slowdown", "0.5")
    try:
        wait_for_db(tmp_path / "n.db", proc)
        db = tmp_path / "n.db"
        full = rate_since(db, time.time())
        os.kill(proc.pid, signal.SIGUSR1)
        slowed = rate_since(db, time.time())
        os.kill(proc.pid, signal.SIGUSR1)
        again = rate_since(db, time.time())
    finally:
        out = stop(proc)
    assert proc.returncode == 0, out
    assert slowed / full == pytest.approx(0.5, abs=0.1)
    assert again / full == pytest.approx(1.0, abs=0.1)
    assert "slowdown 0.5 on" in out and "slowdown off" in out


def test_control_file_sets_the_slowdown_and_a_bad_value_is_ignored(tmp_path: Path) -> None:
    control = tmp_path / "control"
    control.write_text("0")
    proc = start(tmp_path, "--control", str(control))
    try:
        wait_for_db(tmp_path / "n.db", proc)
        db = tmp_path / "n.db"
        full = rate_since(db, time.time())
        control.write_text("0.3")
        slowed = rate_since(db, time.time())
        control.write_text("much slower please")
        garbage = rate_since(db, time.time())
        assert proc.poll() is None  # bad input never stops the workload
    finally:
        out = stop(proc)
    assert slowed / full == pytest.approx(0.7, abs=0.1)
    assert garbage / full == pytest.approx(1.0, abs=0.1)  # ignored: falls back to no slowdown
    assert "neither a number nor 'stall'" in out


def test_control_file_stall_stops_launches_while_the_gpu_and_job_file_stay(
    tmp_path: Path,
) -> None:
    control = tmp_path / "control"
    control.write_text("0")
    jobs = tmp_path / "jobs"
    proc = start(tmp_path, "--control", str(control), "--job-id", "4321", "--jobs-dir", str(jobs))
    db = tmp_path / "n.db"
    try:
        wait_for_db(db, proc)
        assert (jobs / "4321.json").exists()
        control.write_text("stall")
        deadline = time.monotonic() + 60
        while read_window(db, time.time(), 1.0).kernel_launches:
            assert time.monotonic() < deadline, "still launching"
            time.sleep(0.1)
        time.sleep(0.5)
        stalled = read_window(db, time.time(), 1.0)
        # Stopped, not gone: the GPU still lists the process and the job file is still there.
        assert stalled.kernel_launches == 0 and stalled.gpu_pids == (proc.pid,)
        assert stalled.gpu_busy_fraction == 0.0
        assert (jobs / "4321.json").exists()
        control.write_text("0")
        assert rate_since(db, time.time()) > 0
    finally:
        out = stop(proc)
    assert proc.returncode == 0, out
    assert "stalled" in out
    assert not (jobs / "4321.json").exists()  # removed on exit, as the epilog does


@pytest.mark.parametrize(
    "args",
    [
        ["--slowdown", "1.5"],
        ["--interval", "0"],
        ["--gpus", "0"],
        ["--noise", "0.9"],
        ["--stall-after", "-1"],
        ["--jobs-dir", "/tmp/x"],  # without --job-id
    ],
)
def test_bad_arguments_are_one_line_usage_errors(tmp_path: Path, args: list[str]) -> None:
    proc = start(tmp_path, *args)
    try:
        out, _ = proc.communicate(timeout=30)
    finally:
        stop(proc)
    assert proc.returncode == 2, out
    assert out.startswith("ingero: ") and len(out.strip().splitlines()) == 1, out
