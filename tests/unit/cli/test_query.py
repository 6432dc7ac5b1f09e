"""``ingero query``: read-only bounded SQL over the node DB, in-process through the CLI."""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path

import pytest

from ingero.cli.main import main
from tests.unit.explain_dbs import TICK_S, workload_db

TICKS = 24  # two minutes of 5 s intervals ending now


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(["query", *args])
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


@pytest.fixture
def node_db(tmp_path: Path) -> Path:
    return workload_db(tmp_path / "node.db", t0=time.time() - TICKS * TICK_S, ticks=TICKS)


def test_sql_as_json(node_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys, "--db", str(node_db), "--json",
        "SELECT op, SUM(count) > 0 AS seen FROM intervals GROUP BY op ORDER BY op",
    )  # fmt: skip
    assert (code, err) == (0, "")
    assert json.loads(out) == {
        "columns": ["op", "seen"],
        "rows": [
            ["cuLaunchKernel", 1],
            ["cudaDeviceSynchronize", 1],
            ["cudaMemcpyAsync", 1],
            ["offcpu", 1],
        ],
        "row_count": 4,
        "truncated": False,
    }


def test_sql_as_table(node_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--db", str(node_db), "SELECT pid, comm, job_id FROM processes")
    assert code == 0 and "train.py" in out and "4242" in out and err == "1 row\n"


def test_table_since_limit_as_csv(node_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "--db", str(node_db), "--table", "gpu_intervals", "--since", "1m", "--limit", "50",
        "--csv",
    )  # fmt: skip
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0
    # 1 GPU x the 5 s intervals ending in the last minute (12, give or take the edge)
    assert 10 <= len(rows) <= 13
    assert all(float(r["ts_end"]) > time.time() - 61 for r in rows)
    ends = [float(r["ts_end"]) for r in rows]
    assert ends == sorted(ends, reverse=True)
    code, out, err = run(capsys, "--db", str(node_db), "--table", "intervals", "--limit", "5")
    assert code == 0 and err == "5 rows\n"


def test_nccl_tables_are_queryable(node_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ingero.nodedb.schema import connect
    from ingero.nodedb.writer import Batch, write_batch

    db = connect(node_db)
    row = {"ts": time.time(), "pid": 1, "job_id": "7", "rank": 0, "comm_hash": "00000000000000ab",
           "comm_rank": 0, "nranks": 4, "calls": 3, "entered_seq": 9, "returned_seq": 8,
           "last_enter_ts": None, "inflight_seq": 9, "inflight_op": "ncclAllReduce",
           "inflight_since": None, "wait_ns": 0, "sampled": 3, "dropped": 0}  # fmt: skip
    write_batch(db, Batch(nccl_comms=[row]))
    db.conn.close()
    code, out, err = run(capsys, "--db", str(node_db), "--json", "--table", "nccl_comms")
    assert (code, err) == (0, ""), err
    got = json.loads(out)
    assert got["row_count"] == 1
    assert dict(zip(got["columns"], got["rows"][0], strict=True))["inflight_seq"] == 9
    code, out, err = run(capsys, "--db", str(node_db), "SELECT COUNT(*) FROM nccl_calls")
    assert code == 0, err


def test_stream_rows_are_queryable(node_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ingero.nodedb.schema import connect
    from ingero.nodedb.writer import Batch, write_batch

    db = connect(node_db)
    row = {"ts_start": time.time() - 1, "ts_end": time.time(), "pid": 1, "job_id": None,
           "rank": None, "stream": "00007f00c0de0000", "syncs": 5, "sync_ns": 10, "launches": 15,
           "steps": 4, "step_ns": 4000, "step_p50_ns": 1000, "step_p90_ns": 1000,
           "step_hist": '{"40": 4}'}  # fmt: skip
    write_batch(db, Batch(stream_intervals=[row]))
    db.conn.close()
    code, out, err = run(
        capsys, "--db", str(node_db), "--json", "--table", "stream_intervals", "--since", "10m"
    )
    assert (code, err) == (0, ""), err
    got = json.loads(out)
    assert got["row_count"] == 1
    assert dict(zip(got["columns"], got["rows"][0], strict=True))["launches"] == 15


def test_row_limit_stops_and_says_so(node_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys, "--db", str(node_db), "--limit", "4", "--json", "SELECT * FROM host_intervals"
    )
    assert code == 0 and json.loads(out)["row_count"] == 4 and json.loads(out)["truncated"]
    assert "stopped at 4 rows" in err


def test_a_runaway_query_hits_the_time_limit(
    node_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    query = "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c) SELECT max(i) FROM c"
    code, out, err = run(capsys, "--db", str(node_db), "--timeout", "300ms", query)
    assert code == 65 and out == ""
    assert err == "ingero: the query ran longer than 0.3s and was stopped\n"


WRITES = [
    "DELETE FROM intervals",
    "UPDATE processes SET comm = 'x'",
    "INSERT INTO processes (pid) VALUES (1)",
    "DROP TABLE intervals",
    "CREATE TABLE evil (x)",
    "CREATE TEMP TABLE evil (x)",
    "ATTACH DATABASE '/tmp/ingero-evil.db' AS evil",
    "PRAGMA journal_mode = DELETE",
    "PRAGMA user_version = 99",
    "PRAGMA query_only = 0",
    "SELECT load_extension('/tmp/evil.so')",
    "VACUUM INTO '/tmp/ingero-query-copy.db'",
    "SELECT 1; DELETE FROM intervals",
    "WITH x AS (SELECT 1) DELETE FROM intervals",
]


@pytest.mark.parametrize("sql", WRITES)
def test_writes_and_escapes_are_refused_and_change_nothing(
    node_db: Path, capsys: pytest.CaptureFixture[str], sql: str
) -> None:
    before = node_db.read_bytes()
    code, out, err = run(capsys, "--db", str(node_db), sql)
    assert code == 65 and out == "" and err.startswith("ingero: ") and err.count("\n") == 1
    assert node_db.read_bytes() == before
    assert not Path("/tmp/ingero-evil.db").exists()
    assert not Path("/tmp/ingero-query-copy.db").exists()


def test_a_write_is_named_as_refused(node_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, _, err = run(capsys, "--db", str(node_db), "DELETE FROM intervals")
    assert "refused: ingero query is read-only" in err


def test_a_bad_statement_is_one_line(node_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "--db", str(node_db), "SELECT nope FROM intervals")
    assert code == 65 and err == "ingero: no such column: nope\n"


def test_missing_db_exits_69(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "--db", str(tmp_path / "absent.db"), "SELECT 1")
    assert code == 69 and "absent.db" in err and "ingero trace --record" in err
    assert not (tmp_path / "absent.db").exists()


def test_not_a_sqlite_file_exits_65(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "junk.db"
    junk.write_text("not sqlite\n" * 500)
    code, _, err = run(capsys, "--db", str(junk), "SELECT 1")
    assert code == 65 and "not a readable SQLite node DB" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give one of an SQL statement, --table or --sites"),
        (["--table", "intervals", "SELECT 1"], "give one of an SQL statement, --table or --sites"),
        (["--since", "5m", "SELECT 1"], "--since goes with --table"),
        (["--json", "--csv", "SELECT 1"], "--json and --csv: pick one"),
        (["--table", "intervals", "--since", "later"], "--since: expected a duration"),
        (["   "], "the query is empty"),
    ],
)
def test_bad_usage(
    node_db: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, _, err = run(capsys, "--db", str(node_db), *args)
    assert code in (2, 65) and message in err
