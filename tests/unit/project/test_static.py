"""The package stays ruff- and mypy-clean; a regression fails the suite, not just a hook."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_clean() -> None:
    result = run("ruff", "check", "ingero", "tests", "bench")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_clean() -> None:
    result = run("mypy", "ingero")
    assert result.returncode == 0, result.stdout + result.stderr
