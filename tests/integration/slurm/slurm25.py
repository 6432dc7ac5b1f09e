"""Where the tests find Slurm 25.11 and pyslurm: a build under ``INGERO_SLURM25_PREFIX``
(default /opt/slurm-25.11) that tests/run.sh makes with tests/slurm25/build.sh from the
vendored source, and the pyslurm wheel it builds there, installed into the test venv."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

from ingero.slurm.pyslurm_backend import pyslurm_installed

REPO = Path(__file__).resolve().parents[3]
PREFIX = Path(os.environ.get("INGERO_SLURM25_PREFIX", "/opt/slurm-25.11"))
TARBALL = Path(
    os.environ.get(
        "INGERO_SLURM25_TARBALL", str(REPO.parent / "shared" / "vendor" / "slurm-25.11.7.tar.xz")
    )
)


# tests/run.sh builds 25.11 in the background while the suite runs (the build's pid here).
BUILD_PID_ENV = "INGERO_SLURM25_BUILD_PID"
_build_failed: list[str] = []


def _running(pid: int) -> bool:
    """The process exists and has not exited (a zombie waits for its parent to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for_build() -> None:
    """Wait for tests/run.sh's background build (once), then install its pyslurm wheel into
    this venv. Not a timed wait: the build ends or fails, and run.sh started it."""
    pid = os.environ.pop(BUILD_PID_ENV, None)
    if not pid:
        return
    log = os.environ.get("INGERO_SLURM25_BUILD_LOG", "its log")
    try:
        _, status = os.waitpid(int(pid), 0)  # after run.sh's exec, the build is our child
        failed = os.waitstatus_to_exitcode(status) != 0
    except ChildProcessError:
        # run.sh's own child (it runs the suite in two parts): wait until it is gone; its
        # result is what PREFIX holds (slurmdbd is installed last).
        while _running(int(pid)):
            time.sleep(2)
        failed = not (PREFIX / "sbin" / "slurmdbd").exists()
    if failed:
        _build_failed.append(f"the Slurm 25.11 build failed (see {log})")
    wheels = sorted((PREFIX / "wheels").glob("pyslurm-*.whl"))
    if wheels and not pyslurm_installed():
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
             "--no-deps", str(wheels[-1])],
            check=True, timeout=600,
        )  # fmt: skip
        importlib.invalidate_caches()


def missing_reason() -> str | None:
    """Why Slurm 25.11 is not here to test against, or None."""
    wait_for_build()
    if _build_failed:  # an error, not a skip: run.sh found the source and the build broke
        raise RuntimeError(_build_failed[0])
    if (PREFIX / "sbin" / "slurmctld").exists():
        return None
    if not TARBALL.exists():
        return f"no Slurm 25.11: {PREFIX} is not built and its source {TARBALL} is absent"
    return (
        f"Slurm 25.11 is not built in {PREFIX}: tests/run.sh builds it as root "
        f"(bash tests/slurm25/build.sh {TARBALL} {PREFIX})"
    )


def pyslurm_missing_reason() -> str | None:
    """Why the pyslurm backend cannot be tested here, or None."""
    reason = missing_reason()
    if reason:
        return reason
    if not pyslurm_installed():
        return (
            "pyslurm is not installed in the test venv: tests/run.sh installs "
            f"{PREFIX}/wheels/pyslurm-*.whl"
        )
    return None
