"""What the kernel says about a daemon the tests started."""

from __future__ import annotations

from pathlib import Path


def rss_bytes(pid: int) -> int:
    """The process's resident set size (VmRSS of /proc/PID/status), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")
