"""Where the tests find Slurm 25.11 and pyslurm: a build under ``INGERO_SLURM25_PREFIX``
(default /opt/slurm-25.11) that tests/run.sh makes with tests/slurm25/build.sh from the
vendored source, and the pyslurm wheel it builds there, installed into the test venv."""

from __future__ import annotations

import os
from pathlib import Path

from ingero.slurm.pyslurm_backend import pyslurm_installed

REPO = Path(__file__).resolve().parents[3]
PREFIX = Path(os.environ.get("INGERO_SLURM25_PREFIX", "/opt/slurm-25.11"))
TARBALL = Path(
    os.environ.get(
        "INGERO_SLURM25_TARBALL", str(REPO.parent / "shared" / "vendor" / "slurm-25.11.7.tar.xz")
    )
)


def missing_reason() -> str | None:
    """Why Slurm 25.11 is not here to test against, or None."""
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
