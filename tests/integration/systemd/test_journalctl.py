"""ingero.journal's journalctl interface against the real journalctl: errors a person sees."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ingero.journal.episodes import EVENT_TYPES
from ingero.journal.journalctl import Journalctl, Query
from ingero.runtime.errors import UnavailableError, UsageError

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("journalctl") is None, reason="journalctl not installed"),
]


def test_bad_time_is_journalctls_own_message() -> None:
    with pytest.raises(UsageError, match="Failed to parse timestamp: soonish"):
        list(Journalctl().lines(Query(types=EVENT_TYPES, since="soonish")))


def test_empty_journal_directory_gives_no_lines(tmp_path: Path) -> None:
    assert list(Journalctl().lines(Query(types=EVENT_TYPES, directory=str(tmp_path)))) == []


def test_missing_journalctl_is_unavailable() -> None:
    with pytest.raises(UnavailableError, match="not found"):
        list(Journalctl("journalctl-does-not-exist").lines(Query(types=EVENT_TYPES)))
