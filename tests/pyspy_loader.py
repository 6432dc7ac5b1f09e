"""A real Python process asleep in a known function (tests/fixtures/pyspy/loader.py), for the
stack snapshot's tests: started, and waited for until it is in that function."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from ingero.push.stack_snapshot import Target, dump, find_py_spy

LOADER = Path(__file__).parent / "fixtures" / "pyspy" / "loader.py"
# Where loader.py's main thread waits: read_batch's sleep (its def is line 10), called from
# Loader.__next__.
READ_LINE, NEXT_LINE = 12, 18


def start_loader(*args: str) -> subprocess.Popen[str]:
    """The loader, once its main thread is in read_batch ("ready" comes a few bytecodes
    before the sleep; a snapshot taken in between would see it at the print)."""
    proc = subprocess.Popen([sys.executable, str(LOADER), *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    py_spy = find_py_spy()
    for _ in range(100):
        threads = dump(Target(proc.pid), py_spy=py_spy) if py_spy else []
        if any(t.stack.frames[:1] and t.stack.frames[0].function == "read_batch" for t in threads):
            break
        time.sleep(0.05)
    return proc
