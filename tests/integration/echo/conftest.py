"""A real ``ingero echo`` per test module, stopped by its PID at teardown."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import EchoProcess


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EchoProcess]:
    proc = EchoProcess(Path(tmp_path_factory.mktemp("echo")))
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
