"""``ingero explain`` end to end in-process: output, JSON, exit codes, bad input."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from ingero.cli.main import main
from ingero.nodedb.schema import SCHEMA_VERSION
from tests.unit.explain_dbs import T0, TICK_S, workload_db

END = T0 + 120 * TICK_S


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(["explain", *args])
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


@pytest.fixture
def slowed(tmp_path: Path) -> Path:
    return workload_db(tmp_path / "node.db", ticks=120, slow_from=60, slowdown=0.3)


def test_names_the_launch_rate_drop_in_a_table(
    slowed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "--db", str(slowed), "--until", "latest")
    assert (code, err) == (0, "")
    assert "Findings, most likely cause first" in out
    assert re.search(r"kernel-launch rate down (29|30|31)%", out)
    assert "off-CPU time of traced threads" in out
    assert "cuLaunchKernel" in out and "train.py" in out and "77" in out


def test_json_report(slowed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--db", str(slowed), "--until", str(END), "--window", "2m", "--json")
    report = json.loads(out)
    assert code == 0 and report["window_s"] == 120.0 and report["empty"] is False
    assert report["recent"] == {"start": END - 120, "end": END}
    # both 2-minute windows lie after the slowdown began: nothing changed between them
    kinds = [f["kind"] for f in report["findings"]]
    assert "launch_rate" not in kinds and "offcpu" not in kinds
    assert {o["op"] for o in report["ops"]} >= {"cuLaunchKernel", "cudaDeviceSynchronize"}
    assert report["processes"][0]["rank"] == 0 and len(report["gpus"]) == 1
    assert report["summary"]["gpu_busy_source"] == "gpu_intervals"
    assert report["summary"]["not_measured"] == "step_rate"


def test_job_option_filters(slowed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--db", str(slowed), "--until", "latest", "--job", "other")
    assert code == 0
    assert out.startswith("nothing recorded for job other in")
    code, out, _ = run(capsys, "--db", str(slowed), "--until", "latest", "--job", "77")
    assert code == 0 and ", job 77:" in out and "kernel-launch rate down" in out


def test_steady_node_says_nothing_stands_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = workload_db(tmp_path / "n.db", ticks=120)
    code, out, _ = run(capsys, "--db", str(path), "--until", "latest")
    assert code == 0 and "nothing stands out against the previous 5 min" in out


def test_empty_window_says_so_and_exits_0(slowed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--db", str(slowed))  # now: years after the recorded rows
    assert (code, err) == (0, "")
    assert "nothing recorded in" in out and "(try --until latest)" in out
    code, out, _ = run(capsys, "--db", str(slowed), "--json")
    assert code == 0 and json.loads(out)["empty"] is True and json.loads(out)["findings"] == []


def test_missing_db_exits_69_naming_path_and_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "--db", str(tmp_path / "absent.db"))
    assert code == 69 and out == ""
    assert err.count("\n") == 1 and str(tmp_path / "absent.db") in err
    assert "ingero trace --record" in err and "--db" in err
    assert not (tmp_path / "absent.db").exists()


def test_not_a_sqlite_file_exits_65(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database, just text\n" * 200)
    code, _, err = run(capsys, "--db", str(junk))
    assert code == 65 and "not a readable SQLite node DB" in err and err.count("\n") == 1


def test_a_sqlite_file_without_node_tables_exits_65(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    code, _, err = run(capsys, "--db", str(other))
    assert code == 65 and "not a node DB (schema version 0" in err


def test_a_newer_schema_is_refused_clearly(
    slowed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conn = sqlite3.connect(slowed)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    code, _, err = run(capsys, "--db", str(slowed))
    assert code == 65 and "newer" in err and "upgrade ingero" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--window", "soon"], "--window: expected a duration"),
        (["--window", "0s"], "--window: must be longer than 0s"),
        (["--until", "yesterday"], "--until: expected Unix seconds or 'latest'"),
    ],
)
def test_bad_options_are_usage_errors(
    slowed: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, _, err = run(capsys, "--db", str(slowed), *args)
    assert code == 2 and message in err


def test_explain_never_writes_the_db(slowed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = slowed.read_bytes()
    run(capsys, "--db", str(slowed), "--until", "latest")
    assert slowed.read_bytes() == before


def test_the_command_echo_investigate_prompt_names_runs(
    slowed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ingero.echo.mcp_server import investigate_text

    text = investigate_text("c1", "77")
    command = text.split("`ingero explain")[1].split("`")[0].split()
    assert command == ["--job", "77"]
    code, out, _ = run(capsys, *command, "--db", str(slowed), "--until", "latest")
    assert code == 0 and "kernel-launch rate down" in out
