"""explain and export join the job's marks to what the node recorded, on real processes.

A real ``ingero workload`` writes what the tracer records; a real ``ingero annotate serve``
on the same node DB; a real job process marks steps and opens the phase ``checkpoint``, and
while it is open the node does block I/O (the workload's ``io`` cause). ``ingero explain``
names the checkpoint phase in the block-I/O chain; ``ingero export`` draws it as a slice.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.annotate.helpers import ROOT
from tests.integration.push.cluster import Procs, ingero, wait_for

pytestmark = pytest.mark.integration

WINDOW_TICKS = 24  # intervals of 0.5 s in each of explain's two 10 s windows, and a few more
JOB = """
import sys, time
from pathlib import Path
from ingero.annotate.client import Annotator
a, done = Annotator(sys.argv[1]), Path(sys.argv[2])
a.phase("checkpoint", "begin", {"step": 100})
print("begun", flush=True)
step = 100
while not done.exists():
    step += 1
    a.step(step)
    time.sleep(0.2)
a.phase("checkpoint", "end")
a.close()
print("ended", a.dropped, flush=True)
"""


def host_rows(db: Path, after: float = 0.0) -> int:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            return int(
                conn.execute(
                    "SELECT COUNT(*) FROM host_intervals WHERE ts_end > ?", (after,)
                ).fetchone()[0]
            )
    except sqlite3.Error:
        return 0


def newest(db: Path) -> float:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return float(conn.execute("SELECT MAX(ts_end) FROM host_intervals").fetchone()[0])


def run(*args: str) -> str:
    result = subprocess.run(
        ingero(*args), cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_explain_and_export_join_the_checkpoint_phase(tmp_path: Path) -> None:
    db, sock, control, done = (tmp_path / n for n in ("n.db", "a.sock", "slow", "done"))
    control.write_text("0")
    procs = Procs()
    try:
        procs.start(ingero("workload", "--db", str(db), "--interval", "0.5", "--noise", "0.02",
                           "--control", str(control)), tmp_path / "workload.log")  # fmt: skip
        wait_for(lambda: host_rows(db) >= WINDOW_TICKS, 120, "a baseline window")
        log = tmp_path / "annotate.log"
        procs.start(ingero("annotate", "serve", "--socket", str(sock), "--db", str(db),
                           "--flush", "0.5"), log)  # fmt: skip
        wait_for(lambda: "listening on" in log.read_text(), 60, "the annotate server")
        job = subprocess.Popen(
            [sys.executable, "-c", JOB, str(sock), str(done)],
            cwd=ROOT, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        procs.running.append(job)  # type: ignore[arg-type]
        assert job.stdout is not None and job.stdout.readline().strip() == "begun"
        switched = newest(db)
        control.write_text("0.3 io")  # the checkpoint writes: block I/O, the job slower
        wait_for(lambda: host_rows(db, switched) >= WINDOW_TICKS, 120, "a slow window")
        done.write_text("")
        assert job.stdout.readline().split() == ["ended", "0"]
        job.wait(timeout=30)
        for proc in reversed(procs.running):
            Procs.stop(proc)
    finally:
        procs.stop_all()

    report = json.loads(run("explain", "--db", str(db), "--until", "latest", "--window", "10s",
                            "--json"))  # fmt: skip
    io = [c for c in report["chains"] if "block" in c["headline"].lower()]
    assert io, [c["headline"] for c in report["chains"]]
    named = [p for c in io for p in c["phases"]]
    assert {p["phase"] for p in named} == {"checkpoint"}
    assert all(p["overlap_s"] > 0 for p in named)
    text = run("explain", "--db", str(db), "--until", "latest", "--window", "10s")
    assert "in phase checkpoint (pid " in text

    trace = json.loads(run("export", "--db", str(db), "--node", "n1", "--since", "1h"))
    marks = [e for e in trace["traceEvents"] if str(e.get("cat", "")).startswith("mark.")]
    phases = [e for e in marks if e["cat"] == "mark.phase"]
    assert [(e["name"], e["ph"]) for e in phases] == [("checkpoint", "X")]
    assert phases[0]["dur"] > 0
    assert len([e for e in marks if e["cat"] == "mark.step"]) > 10
