"""The job's marks joined to what the node recorded: explain names the phase a chain's
evidence falls in, export draws marks, merge and query carry them."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from ingero.cli.main import main
from ingero.nodedb.schema import connect
from tests.unit.chain_dbs import END, T0, TICK_S, Proc, real_db
from tests.unit.tef import problems

CAUSE_AT = T0 + 60 * TICK_S  # real_db's cause begins at tick 60


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(list(args))
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def mark(
    kind: str, name: str, start: float, end: float | None = None, **extra: Any
) -> dict[str, Any]:
    return {"ts_start": start, "ts_end": end, "pid": 4242, "uid": 1000, "job_id": "77",
            "rank": 5, "kind": kind, "name": name, **extra}  # fmt: skip


def with_marks(path: Path, marks: list[dict[str, Any]]) -> Path:
    db = connect(path)
    with db.conn:
        db.table("marks").insert_all(marks)
    db.conn.close()
    return path


@pytest.fixture
def io_db(tmp_path: Path) -> Path:
    """Block I/O from tick 60 on, and the job says it was checkpointing from then on."""
    path = real_db(tmp_path / "n.db", "io", procs=(Proc(rank=5),))
    return with_marks(
        path,
        [
            mark("phase", "evaluate", T0 + 10 * TICK_S, T0 + 20 * TICK_S),  # before: not named
            mark("phase", "checkpoint", CAUSE_AT + 1.0, CAUSE_AT + 42.0),
            mark("step", "step", CAUSE_AT + 50.0, step=1200),
        ],
    )


def test_explain_names_the_phase_a_chain_falls_in(
    io_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "explain", "--db", str(io_db), "--until", str(END), "--json")
    assert (code, err) == (0, "")
    chains = json.loads(out)["chains"]
    io = next(c for c in chains if "block" in c["headline"].lower())
    assert [(p["phase"], p["rank"], p["overlap_s"]) for p in io["phases"]] == [
        ("checkpoint", 5, 41.0)
    ]
    code, out, _ = run(capsys, "explain", "--db", str(io_db), "--until", str(END))
    assert "in phase checkpoint (rank 5, pid 4242): 41 s of" in out
    assert "phase evaluate" not in out


def test_export_draws_phases_as_slices_and_steps_as_instants(
    io_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with_marks(io_db, [mark("phase", "dataload", END - 20.0)])  # still open
    code, out, err = run(capsys, "export", "--db", str(io_db), "--node", "gpu7", "--since", "1h")
    assert code == 0, err
    trace = json.loads(out)
    assert problems(trace) == []
    marks = {
        e["name"]: e for e in trace["traceEvents"] if str(e.get("cat", "")).startswith("mark.")
    }
    assert marks["checkpoint"]["ph"] == "X" and marks["checkpoint"]["dur"] == pytest.approx(41e6)
    assert marks["step 1200"]["ph"] == "i" and marks["step 1200"]["tid"] == 4242
    assert marks["dataload"]["dur"] > 0  # drawn to the end of the trace


def test_merge_and_query_carry_marks(
    io_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "job.db"
    assert run(capsys, "merge", str(out), f"gpu7={io_db}")[0] == 0
    with sqlite3.connect(out) as conn:
        rows = conn.execute("SELECT node, name FROM marks ORDER BY ts_start").fetchall()
    assert rows == [("gpu7", "evaluate"), ("gpu7", "checkpoint"), ("gpu7", "step")]
    code, text, err = run(capsys, "query", "--db", str(io_db), "--table", "marks", "--json")
    assert code == 0, err
    assert sorted(r[7] for r in json.loads(text)["rows"]) == ["checkpoint", "evaluate", "step"]
    # Marks join events by time: the block I/O the node saw during each phase.
    code, text, err = run(capsys, "query", "--db", str(io_db), "--json", JOIN)
    assert code == 0, err
    io = {name: block_io for name, _rank, block_io in json.loads(text)["rows"]}
    assert io["checkpoint"] > 2 * io["evaluate"]  # in 41 s against 50 s


JOIN = """
SELECT m.name, m.rank, SUM(h.block_io_count) AS block_io
FROM marks m JOIN host_intervals h ON h.ts_end > m.ts_start AND h.ts_start < m.ts_end
WHERE m.kind = 'phase' GROUP BY m.name, m.rank
"""
