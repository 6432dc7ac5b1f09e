"""Where stacks show, through the real CLI: explain, query, merge and export on node DBs
whose sampled calls carry call stacks as ``ingero trace`` writes them (node DB v4)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ingero.schema.stacks import loads
from tests.unit.chain_dbs import END, T0, real_db
from tests.unit.stack_dbs import ALLOC, ALLOC_OTHER, LAUNCH, MODEL, add_stacks

RECENT = T0 + 300.0


def ingero(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ingero.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def node_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("stacks") / "gpu01.db"
    real_db(path, "alloc")
    add_stacks(
        path,
        RECENT,
        END,
        [
            ("cuda_driver", "cuMemAlloc", ALLOC, 90, 150_000),
            ("cuda_driver", "cuMemAlloc", ALLOC_OTHER, 10, 150_000),
            ("cuda_driver", "cuLaunchKernel", LAUNCH, 50, 6_500),
        ],
    )
    return path


def test_explain_names_the_executing_line_and_its_caller(node_db: Path) -> None:
    out = ingero("explain", "--db", str(node_db), "--until", str(END))
    chain = next(line for line in out.splitlines() if line.startswith("1. allocator churn"))
    assert "in `allocate_activations` at `job/model.py:88` ← `forward` at `job/model.py:141`" in (
        chain
    )
    assert "fix: Start at `allocate_activations` at `job/model.py:88`" in out
    report = json.loads(ingero("explain", "--db", str(node_db), "--until", str(END), "--json"))
    site = report["chains"][0]["causes"][0]["call_sites"][0]
    assert loads(json.dumps(site["stack"])) == ALLOC
    assert [f.get("line") for f in site["stack"]["frames"]][2:4] == [88, 141]


def test_query_answers_the_stacks_table_and_the_top_sites(node_db: Path) -> None:
    rows = json.loads(
        ingero("query", "--db", str(node_db), "--json",
               "SELECT r.op, COUNT(*), s.frames FROM raw_events r JOIN stacks s"
               " USING (stack_key) GROUP BY r.op, r.stack_key ORDER BY 2 DESC")
    )["rows"]  # fmt: skip
    assert [(op, n) for op, n, _ in rows] == [("cuMemAlloc", 90), ("cuLaunchKernel", 50),
                                              ("cuMemAlloc", 10)]  # fmt: skip
    assert loads(rows[0][2]) == ALLOC
    sites = json.loads(ingero("query", "--db", str(node_db), "--sites", "--json"))
    assert sites["columns"][:3] == ["source", "op", "site"]
    first = dict(zip(sites["columns"], sites["rows"][0], strict=True))
    assert (first["op"], first["site"], first["samples"], first["share"]) == (
        "cuMemAlloc", 1, 90, 0.9
    )  # fmt: skip
    assert first["where"].startswith("in `allocate_activations` at `job/model.py:88`")


def test_merge_keeps_stacks_and_export_slices_carry_frames(node_db: Path, tmp_path: Path) -> None:
    merged = tmp_path / "job.db"
    ingero("merge", str(merged), f"gpu01={node_db}")
    rows = json.loads(
        ingero("query", "--db", str(merged), "--json",
               "SELECT node, stack_key, frames FROM stacks ORDER BY stack_key")
    )["rows"]  # fmt: skip
    assert {(node, key) for node, key, _ in rows} == {
        ("gpu01", s.key()) for s in (ALLOC, ALLOC_OTHER, LAUNCH)
    }
    assert all(loads(frames).key() == key for _, key, frames in rows)
    for source in (node_db, merged):
        trace: dict[str, Any] = json.loads(
            ingero("export", "--db", str(source), "--since", "5m", "--until", str(END))
        )
        allocs = [
            e for e in trace["traceEvents"]
            if e.get("ph") == "X" and e["args"].get("stack_key") == ALLOC.key()
        ]  # fmt: skip
        assert len(allocs) == 90
        assert allocs[0]["args"]["stack"][2:4] == [
            f"allocate_activations at {MODEL}:88",
            f"forward at {MODEL}:141",
        ]
        frame = trace["stackFrames"][str(allocs[0]["sf"])]
        while "parent" in frame and not frame["name"].startswith("allocate"):
            frame = trace["stackFrames"][frame["parent"]]
        assert frame["name"] == f"allocate_activations at {MODEL}:88"
        assert trace["stackFrames"][frame["parent"]]["name"] == f"forward at {MODEL}:141"
