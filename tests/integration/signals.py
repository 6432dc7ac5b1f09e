"""A burst of stop signals at a daemon, as a supervisor that repeats its SIGTERM sends them."""

from __future__ import annotations

import os
import signal
import subprocess
import time


def signal_storm(proc: subprocess.Popen[bytes], count: int = 300, gap_s: float = 0.0005) -> int:
    """SIGTERM and SIGINT, alternating, ``count`` times ``gap_s`` apart or until ``proc`` is
    gone; how many were sent. The gap keeps several inside the daemon's own stop."""
    sent = 0
    for i in range(count):
        if proc.poll() is not None:
            break
        try:
            os.kill(proc.pid, signal.SIGTERM if i % 2 == 0 else signal.SIGINT)
        except ProcessLookupError:
            break
        sent += 1
        time.sleep(gap_s)
    return sent
