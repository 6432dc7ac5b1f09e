"""ingero trace: bad arguments fail at once with one clear line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ingero.cli.trace import parse_size, step, trace
from ingero.runtime.errors import UnavailableError, UsageError
from tests.unit.trace.test_tracer import make_tracer


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


def test_a_failing_interval_is_logged_and_the_next_one_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tracer, probes, _, clock = make_tracer(tmp_path)
    real = probes.snapshot

    def broken() -> Any:
        raise OSError("map read failed")

    probes.snapshot = broken  # type: ignore[method-assign]
    clock.advance(1.0)
    assert step(tracer, 1, 1.0) is None
    assert "interval failed: OSError: map read failed" in capsys.readouterr().err
    probes.snapshot = real  # type: ignore[method-assign]
    clock.advance(1.0)
    assert step(tracer, 2, 1.0) is not None
