"""/proc readers on fixture trees: CPU busy from /proc/stat deltas, MemAvailable."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ingero.collectors.procfs import (
    CpuTimes,
    ProcfsError,
    ProcReader,
    busy_fraction,
    parse_meminfo,
    parse_stat,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "collectors"


def test_stat_fixture_busy_and_total() -> None:
    times = ProcReader(FIXTURES / "proc-t0").cpu_times()
    assert times == CpuTimes(busy=17015, total=138316)


def test_busy_fraction_between_two_fixture_readings(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    shutil.copytree(FIXTURES / "proc-t0", proc)
    reader = ProcReader(proc)
    assert reader.cpu_busy_fraction() is None  # no previous reading yet
    shutil.copy(FIXTURES / "proc-t1" / "stat", proc / "stat")
    assert reader.cpu_busy_fraction() == pytest.approx(400 / 500)


@pytest.mark.parametrize(
    ("previous", "current", "expected"),
    [
        (CpuTimes(10, 100), CpuTimes(10, 100), None),  # no time passed
        (CpuTimes(50, 100), CpuTimes(40, 200), None),  # counters reset
        (CpuTimes(10, 100), CpuTimes(10, 200), 0.0),
        (CpuTimes(10, 100), CpuTimes(110, 200), 1.0),
    ],
)
def test_busy_fraction_edges(previous: CpuTimes, current: CpuTimes, expected: float | None) -> None:
    assert busy_fraction(previous, current) == expected


def test_meminfo_fixture() -> None:
    mem = ProcReader(FIXTURES / "proc-t0").meminfo()
    assert mem.total_kib == 24684084
    assert mem.available_kib == 6171021
    assert mem.available_fraction == pytest.approx(6171021 / 24684084)


def test_old_kernel_stat_with_seven_columns_and_no_memavailable() -> None:
    reader = ProcReader(FIXTURES / "proc-old-kernel")
    assert reader.cpu_times() == CpuTimes(busy=1 + 2 + 3 + 6 + 7, total=28)
    with pytest.raises(ProcfsError, match="no MemAvailable"):
        reader.meminfo()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cpu  abc 1 2 3\n", "non-numeric"),
        ("cpu0 1 2 3 4\n", "no aggregate cpu line"),
        ("cpu 1 2\n", "usable columns"),
        ("", "no aggregate cpu line"),
    ],
)
def test_bad_stat_is_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(ProcfsError, match=message):
        parse_stat(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [("MemTotal: 0 kB\n", "no MemTotal"), ("garbage\n", "no MemTotal")],
)
def test_bad_meminfo_is_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(ProcfsError, match=message):
        parse_meminfo(text)


def test_available_above_total_is_capped() -> None:
    mem = parse_meminfo("MemTotal: 100 kB\nMemAvailable: 150 kB\n")
    assert mem.available_fraction == 1.0


def test_bad_fixture_tree_and_missing_root() -> None:
    with pytest.raises(ProcfsError, match="non-numeric"):
        ProcReader(FIXTURES / "proc-bad").cpu_times()
    with pytest.raises(ProcfsError, match="cannot read"):
        ProcReader(FIXTURES / "does-not-exist").meminfo()


def test_live_proc_reads() -> None:
    reader = ProcReader()
    reader.cpu_busy_fraction()
    assert 0.0 < reader.meminfo().available_fraction <= 1.0
