"""Fixtures shared by the integration test packages."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.push.cluster import Procs


@pytest.fixture
def procs() -> Iterator[Procs]:
    """Processes a test starts; each is stopped by its own PID afterwards."""
    p = Procs()
    try:
        yield p
    finally:
        p.stop_all()
