"""Fixtures of the annotate tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A directory every user may enter, so a socket's own mode decides who connects."""
    path = Path(tempfile.mkdtemp(prefix="ingero-annotate-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)
