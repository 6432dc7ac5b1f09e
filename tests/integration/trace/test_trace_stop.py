"""A tracer asked to stop while it compiles its BPF program (seconds; 15 s on a real node)
stops cleanly when the compile returns: exit 0, as every daemon's SIGTERM, not SIGTERM's
default death in the middle of the start."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.trace.conftest import REPO

pytestmark = pytest.mark.integration


def bcc_loaded(pid: int) -> bool:
    try:
        return "libbcc" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def test_a_stop_during_the_compile_exits_0_and_traces_nothing(
    bpf_ready: None, tmp_path: Path
) -> None:
    db = tmp_path / "node.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ingero.cli.main", "trace", "--record", "--db", str(db)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # libbcc mapped: BCC is imported, so the program's compile is running or next.
        deadline = time.monotonic() + 60
        while not bcc_loaded(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert bcc_loaded(proc.pid), "the tracer never loaded BCC"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    with sqlite3.connect(db) as con:  # stopped before it attached: not one interval
        assert con.execute("SELECT count(*) FROM host_intervals").fetchone() == (0,)
