"""A real systemd as PID 1 in private namespaces, for tests on hosts whose PID 1 is not systemd.

Wraps the ``sysd-ns`` script next to this file: the container's root is a throw-away overlay
of the host root (writes never reach the host), /run /dev /proc /sys are private, and every
other host path (the repo, the venv, build/) is visible inside as it is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

SCRIPT = Path(__file__).with_name("sysd-ns")
# ingero's state, config and install prefix on a host: absent in every container.
HOST_STATE = ("/var/lib/ingero", "/etc/ingero", "/opt/ingero")


def unavailable_reason() -> str | None:
    """Why a container cannot boot here, or None when it may."""
    if os.geteuid() != 0:
        return "booting systemd in namespaces needs root"
    for tool in ("unshare", "nsenter", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} (util-linux) not installed"
    if not Path("/lib/systemd/systemd").exists():
        return "systemd is not installed"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlayfs"
    return None


class SystemdContainer:
    """One booted container; ``run`` executes a command inside it as root."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.booted = False

    def up(self, net: bool = False, timeout: float = 90) -> None:
        """Boot; ``net`` gives the container its own network namespace (loopback only)."""
        result = subprocess.run(
            [str(SCRIPT), "up", self.name, *(["--net"] if net else [])],
            # A host where ingero ran (an `ingero check` or `ingero trace` as root creates
            # /var/lib/ingero/ingero.db) is still a fresh host inside the container.
            env={**os.environ, "SYSD_NS_HIDE": " ".join(HOST_STATE)},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            self.down()
            raise RuntimeError(f"systemd container did not boot: {result.stderr[-800:]}")
        self.booted = True

    def down(self) -> None:
        subprocess.run(
            [str(SCRIPT), "down", self.name], capture_output=True, timeout=60, check=False
        )
        self.booted = False

    @property
    def root(self) -> Path:
        """The host path of the container's / (writes there land in its overlay)."""
        out = subprocess.run(
            [str(SCRIPT), "root", self.name], capture_output=True, text=True, check=True
        )
        return Path(out.stdout.strip())

    def run(
        self, *cmd: str, check: bool = True, timeout: float = 120, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(SCRIPT), "exec", self.name, *cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"{' '.join(cmd)} exited {result.returncode}\n"
                f"stdout: {result.stdout[-3000:]}\nstderr: {result.stderr[-3000:]}"
            )
        return result

    def prop(self, unit: str, name: str) -> str:
        return self.run("systemctl", "show", unit, "-p", name, "--value").stdout.strip()

    def journal(self, *args: str) -> str:
        self.run("journalctl", "--sync", check=False)
        return self.run("journalctl", "--no-pager", *args).stdout


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0, step: float = 0.2) -> bool:
    """Poll until ``predicate`` holds; the timeout only bounds a failing test."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step)
    return predicate()
