"""Stacks in query, merge and export, in-process: the edges (older node DBs, damaged rows)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.unit.chain_dbs import END, T0, real_db
from tests.unit.cli.test_merge import run
from tests.unit.stack_dbs import ALLOC, LAUNCH, MODEL, NATIVE_ONLY, add_stacks, downgrade_to_v3
from tests.unit.tef import problems


@pytest.fixture
def node_db(tmp_path: Path) -> Path:
    path = real_db(tmp_path / "gpu01.db")
    add_stacks(path, END - 60, END, [("cuda_driver", "cuMemAlloc", ALLOC, 6, 150_000),
                                     ("cuda_driver", "cuMemAlloc", LAUNCH, 2, 150_000),
                                     ("nccl", "ncclAllReduce", NATIVE_ONLY, 3, 900_000)])  # fmt: skip
    return path


def test_sites_share_counts_calls_without_a_stack(
    node_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with sqlite3.connect(node_db) as conn:  # two more sampled calls, no stack captured
        conn.execute("INSERT INTO raw_events (ts, pid, source, op, duration_ns)"
                     f" VALUES ({END - 1}, 4242, 'cuda_driver', 'cuMemAlloc', 150000),"
                     f" ({END - 2}, 4242, 'cuda_driver', 'cuMemAlloc', 150000)")  # fmt: skip
    code, out, _ = run(capsys, "query", "--db", str(node_db), "--sites", "--json")
    rows = [dict(zip(json.loads(out)["columns"], r, strict=True)) for r in json.loads(out)["rows"]]
    # ops with the most sampled time first; share is of all the op's sampled calls
    assert (code, [(r["op"], r["site"], r["samples"], r["share"]) for r in rows]) == (0, [
        ("ncclAllReduce", 1, 3, 1.0), ("cuMemAlloc", 1, 6, 0.6), ("cuMemAlloc", 2, 2, 0.2)
    ])  # fmt: skip
    nccl = next(r for r in rows if r["op"] == "ncclAllReduce")
    assert nccl["where"] == "in `ncclAllReduce` (libnccl.so.2)"


def test_sites_on_a_node_db_without_stacks_says_so(
    node_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = downgrade_to_v3(node_db, tmp_path / "v3.db")
    code, _, err = run(capsys, "query", "--db", str(old), "--sites")
    assert code == 65
    assert "no call stacks in this node DB (schema version 3;" in err
    assert len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, "query", "--db", str(old), "--sites", "--table", "stacks")
    assert code == 2 and "give one of an SQL statement, --table or --sites" in err


def test_merge_of_an_older_and_a_newer_node_db(
    node_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = downgrade_to_v3(real_db(tmp_path / "gpu02.db", seed=5), tmp_path / "gpu02-v3.db")
    merged = tmp_path / "job.db"
    code, _, err = run(capsys, "merge", str(merged), f"gpu01={node_db}", f"gpu02={old}")
    assert code == 0, err
    code, out, _ = run(capsys, "query", "--db", str(merged), "--json",
                       "SELECT node, COUNT(*) FROM stacks GROUP BY node")  # fmt: skip
    assert json.loads(out)["rows"] == [["gpu01", 3]]
    code, out, _ = run(capsys, "query", "--db", str(merged), "--json",
                       "SELECT node, COUNT(stack_key), COUNT(*) > 0 FROM intervals"
                       " LEFT JOIN (SELECT node AS n, stack_key FROM raw_events) ON n = node"
                       " GROUP BY node")  # fmt: skip
    assert [r[::2] for r in json.loads(out)["rows"]] == [["gpu01", 1], ["gpu02", 1]]


def export(capsys: pytest.CaptureFixture[str], db: Path) -> dict[str, Any]:
    code, out, err = run(capsys, "export", "--db", str(db), "--since", "2m", "--until", str(END))
    assert code == 0, err
    trace: dict[str, Any] = json.loads(out)
    assert problems(trace) == []
    return trace


def test_export_gives_a_slice_its_frames_and_leaves_a_damaged_one_without(
    node_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with sqlite3.connect(node_db) as conn:
        conn.execute("UPDATE stacks SET frames = 'not json' WHERE stack_key = ?", (LAUNCH.key(),))
    trace = export(capsys, node_db)
    slices = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["cat"] != "ingero"]
    by_key: dict[str, list[dict[str, Any]]] = {}
    for e in slices:
        by_key.setdefault(e["args"].get("stack_key"), []).append(e)
    good = by_key[ALLOC.key()]
    assert len(good) == 6 and good[0]["args"]["stack"][2] == f"allocate_activations at {MODEL}:88"
    damaged = by_key[LAUNCH.key()]
    assert len(damaged) == 2 and all("stack" not in e["args"] and "sf" not in e for e in damaged)
    (native,) = {e["sf"] for e in by_key[NATIVE_ONLY.key()]}
    assert trace["stackFrames"][str(native)] == {"name": "ncclAllReduce (libnccl.so.2)",
                                            "category": "/opt/libnccl.so.2"}  # fmt: skip
    assert by_key[NATIVE_ONLY.key()][0]["args"]["stack_reason"] == NATIVE_ONLY.reason


def test_export_of_a_node_db_without_stacks_has_no_frames(
    node_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = export(capsys, downgrade_to_v3(node_db, tmp_path / "v3.db"))
    assert "stackFrames" not in trace
    assert not any("stack" in e.get("args", {}) for e in trace["traceEvents"])
    assert T0 < END
