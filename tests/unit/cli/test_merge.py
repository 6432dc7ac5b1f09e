"""``ingero merge``: node DBs in one queryable DB with node, job and rank on every row."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

from ingero.cli.main import main
from ingero.nodedb.schema import SCHEMA_VERSION
from ingero.nodedb.tables import NODE_TABLES
from tests.unit.chain_dbs import Proc, real_db


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(list(args))
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


@pytest.fixture
def two(tmp_path: Path) -> tuple[Path, Path]:
    a = real_db(tmp_path / "gpu01.db", "cpu", procs=(Proc(pid=10, job_id="77", rank=0),))
    b = real_db(
        tmp_path / "gpu02.db", None, procs=(Proc(pid=10, job_id="77", rank=1),), gpu_columns=True
    )
    return a, b


def counts(path: Path) -> dict[str, int]:
    conn = sqlite3.connect(path)
    try:
        return {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in NODE_TABLES}
    finally:
        conn.close()


def digest(path: Path) -> str:
    conn = sqlite3.connect(path)
    h = hashlib.sha256()
    for table in NODE_TABLES:
        for row in sorted(map(repr, conn.execute(f"SELECT * FROM {table}"))):
            h.update(row.encode())
    conn.close()
    return h.hexdigest()


def test_every_row_has_node_job_and_rank_and_the_db_is_queryable(
    tmp_path: Path, two: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = two
    out = tmp_path / "all.db"
    code, _, err = run(capsys, "merge", str(out), str(a), f"second={b}")
    assert code == 0, err
    assert "gpu01: " in err and "second: " in err
    merged, ca, cb = counts(out), counts(a), counts(b)
    assert merged == {t: ca[t] + cb[t] for t in NODE_TABLES}
    conn = sqlite3.connect(out)
    for table in NODE_TABLES:
        nulls = conn.execute(
            f"SELECT COUNT(*) FROM {table} WHERE node IS NULL OR job_id IS NULL OR rank IS NULL"
        ).fetchone()[0]
        assert nulls == 0, table
    # node-wide rows got the node's one job rank; the processes of both nodes share pid 10
    assert conn.execute(
        "SELECT node, job_id, rank, COUNT(*) FROM host_intervals GROUP BY node ORDER BY node"
    ).fetchall() == [("gpu01", "77", 0, 120), ("second", "77", 1, 120)]
    assert conn.execute("SELECT node, pid FROM processes ORDER BY node").fetchall() == [
        ("gpu01", 10),
        ("second", 10),
    ]
    # the NVML columns of schema 2 come through the merge
    cols = [r[1] for r in conn.execute("PRAGMA table_info(gpu_intervals)")]
    assert {"throttle_reasons", "xids", "node", "job_id", "rank"} <= set(cols)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()
    code, out_text, _ = run(
        capsys,
        "query",
        "--db",
        str(out),
        "--json",
        "SELECT node, rank, COUNT(*) FROM intervals GROUP BY node ORDER BY node",
    )
    assert code == 0 and json.loads(out_text)["rows"] == [
        ["gpu01", 0, 120 * 5 + 1],
        ["second", 1, 120 * 5 + 1],
    ]


def test_merging_again_gives_the_same_database(
    tmp_path: Path, two: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = two
    out = tmp_path / "all.db"
    assert run(capsys, "merge", str(out), str(a), str(b))[0] == 0
    first = digest(out)
    assert run(capsys, "merge", str(out), str(a), str(b))[0] == 0
    assert run(capsys, "merge", str(out), str(b))[0] == 0
    assert digest(out) == first
    # a node merged alone later keeps the others' rows
    assert counts(out)["intervals"] == counts(a)["intervals"] + counts(b)["intervals"]


def test_a_newer_node_db_is_refused_in_one_line_before_anything_is_written(
    tmp_path: Path, two: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a, _ = two
    newer = real_db(tmp_path / "newer.db", None)
    conn = sqlite3.connect(newer)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    out = tmp_path / "all.db"
    code, _, err = run(capsys, "merge", str(out), str(a), str(newer))
    assert code == 65
    assert err.count("\n") == 1 and "newer" in err and str(newer) in err
    assert not out.exists()


def test_a_newer_or_foreign_output_is_refused(
    tmp_path: Path, two: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = two
    code, _, err = run(capsys, "merge", str(b), str(a))  # OUT is a node DB
    assert code == 65 and "is not a merged database" in err
    out = tmp_path / "all.db"
    assert run(capsys, "merge", str(out), str(a))[0] == 0
    conn = sqlite3.connect(out)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    code, _, err = run(capsys, "merge", str(out), str(a))
    assert code == 65 and "is newer than this ingero" in err and err.count("\n") == 1


def test_bad_inputs(
    tmp_path: Path, two: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a, _ = two
    out = str(tmp_path / "all.db")
    assert run(capsys, "merge", out, str(tmp_path / "absent.db"))[0] == 69
    code, _, err = run(capsys, "merge", out, f"n={a}", f"n={a}")
    assert code == 65 and "given twice" in err
    code, _, err = run(capsys, "merge", out)
    assert code == 2 and "give node DB files" in err


def test_explain_reads_a_merge_of_node_dbs_without_a_table_of_this_schema(
    tmp_path: Path, two: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Node DBs from before version 6 have no stream_intervals; their merge is at this
    schema's version all the same (its tables are what the nodes had), and explain reads
    it (it once exited 65: no such table)."""
    for path in two:
        conn = sqlite3.connect(path)
        conn.executescript("DROP TABLE stream_intervals; PRAGMA user_version = 5;")
        conn.close()
    out = tmp_path / "all.db"
    assert run(capsys, "merge", str(out), *map(str, two))[0] == 0
    conn = sqlite3.connect(out)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    conn.close()
    assert "stream_intervals" not in tables and "intervals" in tables
    code, text, err = run(capsys, "explain", "--db", str(out), "--until", "latest", "--json")
    assert code == 0, err
    report = json.loads(text)
    assert not report["empty"] and report["ops"], report
