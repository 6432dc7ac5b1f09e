from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.fleet.helpers import Fleet, start_fleet


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    """A fleet with push_interval 0.2s, EMA off (alpha 1) and nodes that never expire."""
    daemon = start_fleet(tmp_path)
    try:
        yield daemon
    finally:
        daemon.stop()
