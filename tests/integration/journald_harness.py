"""A real, throw-away systemd-journald for tests: ``run_with_journald(cmd)``.

journald's socket path is fixed (/run/systemd/journal/socket), so it runs in a private mount
namespace (needs root and unshare); the command runs in that namespace too, so it can both
write entries and read them back with ``journalctl``. Nothing touches the host's journal.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).with_name("jd_standalone.sh")
JOURNALD = Path("/lib/systemd/systemd-journald")


def unavailable() -> str | None:
    """Why a standalone journald cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "a private mount namespace for journald needs root"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    if not JOURNALD.exists() or shutil.which("journalctl") is None:
        return "systemd-journald / journalctl are not installed"
    probe = subprocess.run(
        ["unshare", "--mount", "true"], capture_output=True, text=True, timeout=10
    )
    if probe.returncode != 0:
        return f"unshare --mount is not permitted here: {probe.stderr.strip()}"
    return None


def run_with_journald(
    cmd: list[str],
    timeout: float = 60,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` beside a fresh journald; its output is returned (journald is stopped after)."""
    return subprocess.run(
        [str(SCRIPT), *cmd],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )
