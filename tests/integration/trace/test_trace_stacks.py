"""Real BPF: a CPython process calls the stand-in libcudart through ctypes from known lines,
in three threads; the node DB names the executing line and the callers."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.trace.conftest import interpreters, wait_rows

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).parent / "py_stacks.py"
CALLS = 1000


def _sync_stacks(db: Path, pid: int) -> list[tuple[int, str]]:
    """(tid, frames JSON) of the process's sampled cudaStreamSynchronize calls, oldest first."""
    conn = sqlite3.connect(db)
    try:
        return conn.execute(
            "SELECT r.tid, s.frames FROM raw_events r JOIN stacks s USING (stack_key) "
            "WHERE r.pid = ? AND r.op = 'cudaStreamSynchronize' ORDER BY r.ts", (pid,)
        ).fetchall()  # fmt: skip
    finally:
        conn.close()


def _script_lines(stack: dict[str, Any]) -> list[tuple[str, int]]:
    return [(f["function"], f["line"]) for f in stack["frames"]
            if f["kind"] == "py" and f["file"] == str(SCRIPT)]  # fmt: skip


def _expected(marks: dict[str, int], qualname: bool = True) -> list[tuple[str, int]]:
    """The script's frames, innermost first; 3.10 names a method by ``co_name`` only."""
    forward = "Model.forward" if qualname else "forward"
    return [("leaf", marks["leaf"]), (forward, marks["forward"]), ("outer", marks["outer"])]


def _python310() -> Any:
    found = [p for p in interpreters() if isinstance(p, str) and p.endswith("python3.10")]
    return found[0] if found else pytest.param("python3.10", marks=pytest.mark.skip(
        reason="no CPython 3.10 here (pyenv)"))  # fmt: skip


# 3.11 walks its frames from the thread state's cframe, 3.12 adds C-stack shim frames
# (a trampoline code object) and 3.13 shim frames with None for code: both are dropped.
@pytest.mark.parametrize("python", interpreters(minor_from=11))
def test_sampled_calls_carry_python_and_native_frames(
    python: str, start_tracer: Any, spawn: Any, runtime_loop: Path
) -> None:
    lib = runtime_loop.parent / "libcudart.so.13"
    workload = spawn([python, str(SCRIPT), "cuda", str(lib), str(CALLS)])
    assert workload.stdout.readline().strip() == "ready"
    tracer = start_tracer("--pid", str(workload.pid), "--sample-every", "1")
    out, err = workload.communicate("go\n", timeout=120)
    assert workload.returncode == 0, err
    marks = {k: int(v) for k, v in (kv.split("=") for kv in out.split())}
    sql = "SELECT COUNT(*) FROM raw_events WHERE pid = ? AND stack_key IS NOT NULL"
    got = wait_rows(tracer.db, sql, (workload.pid,), 3 * CALLS, tracer.notify)
    code, stderr = tracer.stop()
    assert code == 0, stderr[-2000:]
    conn = sqlite3.connect(tracer.db)
    dropped = conn.execute("SELECT SUM(dropped_events) FROM host_intervals").fetchone()[0] or 0
    conn.close()
    assert got > 0 and got + dropped >= 3 * CALLS  # every sample arrived or was counted lost
    rows = set(_sync_stacks(tracer.db, workload.pid))
    # The threads are born after the tracer's last look at the interpreter: the program
    # finds each one in the interpreter's list at its first sample.
    full = set()
    for tid, frames in rows:
        stack = json.loads(frames)
        assert _script_lines(stack) == _expected(marks), stack
        # Then threading's own frames, and nothing but the user's code (no shim frame).
        files = [f["file"] for f in stack["frames"] if f["kind"] == "py"]
        assert all(f and f.endswith(".py") for f in files), stack
        assert [f["function"] for f in stack["frames"] if f["kind"] == "py"][3:] == [
            "Thread.run", "Thread._bootstrap_inner", "Thread._bootstrap"], stack  # fmt: skip
        native = [f for f in stack["frames"] if f["kind"] == "native"]
        assert native and stack["frames"][0]["kind"] == "native"  # ctypes/libffi, inner
        assert all(f.get("addr") for f in native), native
        # The caller of the probed call is ctypes' libffi (named by the mapped file; its
        # internal function is not in its dynamic symbols, so it has no name).
        assert "libffi" in (native[0].get("lib") or ""), native
        assert "reason" not in stack
        full.add(tid)
    assert len(full) == 3  # each thread's own state was walked


# 3.14 (the last), and 3.10, whose thread state holds a pthread_t and no kernel tid: the
# program reads the tid out of glibc's struct pthread.
@pytest.mark.parametrize("python", [sys.executable, _python310(), interpreters()[-1]])
def test_a_new_threads_first_slow_call_has_its_python_frames(
    python: str, start_tracer: Any, spawn: Any, runtime_loop: Path
) -> None:
    """A thread started after the tracer read the interpreter's threads, whose very first
    call is slow (sampled for that, at the default 1-in-64): its Python frames, no reason."""
    lib = runtime_loop.parent / "libcudart.so.13"
    env = dict(os.environ, FAKE_CUDA_SYNC_US="30000")
    workload = spawn([python, str(SCRIPT), "late", str(lib), "3"], env=env)
    assert workload.stdout.readline().strip() == "ready"
    tracer = start_tracer("--pid", str(workload.pid))
    out, err = workload.communicate("go\n", timeout=120)
    assert workload.returncode == 0, err
    marks = {k: int(v) for k, v in (kv.split("=") for kv in out.split())}
    sql = "SELECT COUNT(*) FROM raw_events WHERE pid = ? AND stack_key IS NOT NULL"
    got = wait_rows(tracer.db, sql, (workload.pid,), 3, tracer.notify)
    code, stderr = tracer.stop()
    assert code == 0, stderr[-2000:]
    assert got == 3  # each call is slow: each carries its stack
    rows = _sync_stacks(tracer.db, workload.pid)
    assert len(rows) == 3 and rows[0][0] != workload.pid
    first = json.loads(rows[0][1])  # the thread's first call
    assert _script_lines(first) == _expected(marks, not python.endswith("3.10")), first
    assert "reason" not in first, first


FLOOD = Path(__file__).parent / "py_flood.py"


def test_a_flood_of_samples_never_holds_up_the_interval_or_the_stop(
    start_tracer: Any, spawn: Any, runtime_loop: Path
) -> None:
    """A launch-bound job with stacks on sends more samples than the reader reads (seen on a
    real H200: one consume ran until the job ended, so one interval row covered 30 s)."""
    lib = runtime_loop.parent / "libcudart.so.13"
    workload = spawn([sys.executable, str(FLOOD), str(lib)])
    assert workload.stdout.readline().strip() == "ready"
    tracer = start_tracer("--pid", str(workload.pid), "--sample-every", "1", interval="0.2")
    workload.stdin.write("go\n")
    workload.stdin.flush()
    for _ in range(6):  # intervals keep closing while the flood goes on
        tracer.notify.wait_for("WATCHDOG=1", timeout=30)
    assert workload.poll() is None
    code, stderr = tracer.stop()  # asked to stop in the middle of the flood: it does
    out, _ = workload.communicate("stop\n", timeout=60)
    assert code == 0, stderr[-2000:]
    conn = sqlite3.connect(tracer.db)
    try:
        ends = conn.execute(
            "SELECT COUNT(DISTINCT ts_end) FROM intervals WHERE pid = ?", (workload.pid,)
        ).fetchone()[0]
        sampled = conn.execute("SELECT COUNT(*) FROM raw_events WHERE pid = ?", (workload.pid,))
        n_sampled = sampled.fetchone()[0]
        dropped = conn.execute("SELECT SUM(dropped_events) FROM host_intervals").fetchone()[0]
    finally:
        conn.close()
    calls = int(out.split("=")[1])
    assert ends >= 5  # one row per interval, not one for the whole flood
    # Every call was sampled (--sample-every 1): read, counted as dropped, or still in the
    # ring when the tracer stopped; never more read than made.
    assert 0 < n_sampled <= calls, (n_sampled, dropped, calls)
