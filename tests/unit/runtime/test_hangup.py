"""StartupHangups: a SIGHUP while a daemon starts is counted, not fatal, and taken once."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from ingero.runtime.hangup import StartupHangups


@pytest.fixture
def restore_sighup() -> Iterator[None]:
    before = signal.getsignal(signal.SIGHUP)
    yield
    signal.signal(signal.SIGHUP, before)


@pytest.mark.usefixtures("restore_sighup")
@pytest.mark.parametrize("sent", [0, 1, 3])
def test_sighups_during_start_are_one_reload(sent: int, caplog: pytest.LogCaptureFixture) -> None:
    hangups = StartupHangups("fleet").install()
    for _ in range(sent):
        os.kill(os.getpid(), signal.SIGHUP)  # the handler runs in this (main) thread
    caplog.set_level("INFO", "ingero.runtime.hangup")
    assert hangups.take() is (sent > 0)
    assert hangups.take() is False  # taken once
    lines = [r.getMessage() for r in caplog.records]
    # pending signals of one kind may coalesce: at least one is counted, never more than sent
    assert len(lines) == (1 if sent else 0)
    if sent:
        count = int(lines[0].split()[1])
        assert 1 <= count <= sent
        assert lines[0] == (
            f"fleet: {count} SIGHUP during start-up, reloading once now that it is ready"
        )
