"""ingero trace: bad arguments fail at once with one clear line."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from ingero.cli.trace import parse_size, trace
from ingero.errors import UnavailableError, UsageError


def test_parse_size() -> None:
    assert parse_size("512M") == 512 * 1024**2
    assert parse_size("2g") == 2 * 1024**3
    assert parse_size("100KiB") == 100 * 1024
    assert parse_size("1048576") == 1024**2
    for bad in ("lots", "-1G", "1X", "10"):
        with pytest.raises(UsageError):
            parse_size(bad)


def test_bad_max_db_and_pid(tmp_path: object) -> None:
    runner = CliRunner()
    result = runner.invoke(trace, ["--max-db", "huge", "--db", "/tmp/x.db"])
    assert isinstance(result.exception, UsageError)
    assert "--max-db" in str(result.exception)
    result = runner.invoke(trace, ["--pid", "999999999", "--db", "/tmp/x.db"])
    assert isinstance(result.exception, UsageError)
    assert "no such process" in str(result.exception)


def test_bad_interval_is_rejected() -> None:
    result = CliRunner().invoke(trace, ["--interval", "0"])
    assert result.exit_code == 2 and "--interval" in result.output


def test_unwritable_db_is_one_clear_error() -> None:
    result = CliRunner().invoke(trace, ["--record", "--db", "/proc/self/nope/node.db"])
    assert isinstance(result.exception, UnavailableError)
    assert "cannot open the node DB" in str(result.exception)
