"""SignalEvent: a threading.Event that a signal handler may set at any point of the main thread."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from ingero.runtime.signals import SignalEvent

ROOT = Path(__file__).resolve().parents[3]


def test_it_behaves_as_a_threading_event() -> None:
    event = SignalEvent()
    assert isinstance(event, threading.Event)
    assert not event.is_set()
    assert event.wait(0) is False
    assert event.wait(0.01) is False
    event.set()
    event.set()  # twice: the pipe holds one byte, nothing blocks
    assert event.is_set() and event.wait() is True and event.wait(0) is True
    event.clear()
    assert not event.is_set() and event.wait(0.01) is False
    event.set()
    assert event.wait(0) is True


def test_set_wakes_every_waiting_thread_at_once() -> None:
    event = SignalEvent()
    woke: list[bool] = []
    threads = [threading.Thread(target=lambda: woke.append(event.wait(60))) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    event.set()
    for t in threads:
        t.join(10)
    assert woke == [True] * 4


STORM = """
import signal, sys, time
from ingero.runtime.signals import SignalEvent
event = SignalEvent()
handled = 0
def handler(signum, frame):
    global handled
    handled += 1
    event.set()
signal.signal(signal.SIGALRM, handler)
signal.setitimer(signal.ITIMER_REAL, 0.0001, 0.0001)
loops = 0
end = time.monotonic() + 1.5
while time.monotonic() < end:
    event.set(); event.clear(); event.wait(0); loops += 1
signal.setitimer(signal.ITIMER_REAL, 0)
print(loops, handled)
"""


def test_a_storm_of_signals_setting_it_never_deadlocks() -> None:
    """A signal every 100 us, its handler setting the event while the main thread sets,
    clears and waits on it: a threading.Event there ends in a deadlock or a crash within a
    second (its condition lock is not re-entrant); this one never takes a lock."""
    out = subprocess.run(
        [sys.executable, "-c", STORM], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    loops, handled = map(int, out.stdout.split())
    assert loops > 1000 and handled > 100
