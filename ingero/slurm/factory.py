"""The backend ``drain.backend`` names: scontrol, pyslurm, or ``auto`` (docs/slurm.md
"Backends"). The one module that knows both implementations."""

from __future__ import annotations

import logging
import shutil
import sys

from ingero.runtime.errors import ConfigError, UnavailableError
from ingero.slurm.backend import (
    DEFAULT_TIMEOUT,
    AccountingBackend,
    SlurmError,
    installed_slurm_version,
)
from ingero.slurm.pyslurm_backend import PyslurmBackend, pyslurm_installed
from ingero.slurm.scontrol_backend import ScontrolBackend

log = logging.getLogger(__name__)


def make_backend(kind: str = "auto", timeout: float = DEFAULT_TIMEOUT) -> AccountingBackend:
    """The backend ``drain.backend`` names (docs/slurm.md "Backends").

    ``pyslurm`` needs pyslurm importable by this interpreter; whether it loads and matches
    this host's Slurm shows on its first call (a SlurmError the caller retries), so a
    daemon starts either way. ``auto`` starts pyslurm's worker once, here: pyslurm when it
    loads and is built for the Slurm release ``scontrol --version`` reports (or no scontrol
    is installed), else scontrol.
    """
    if kind not in ("auto", "scontrol", "pyslurm"):
        raise ConfigError(f"drain.backend: unknown backend {kind!r}")
    if kind != "scontrol":
        if pyslurm_installed():
            backend = PyslurmBackend(
                timeout=timeout, site_version=lambda: installed_slurm_version(timeout)
            )
            if kind == "pyslurm":
                return backend
            try:
                backend.start()
                return backend
            except SlurmError as exc:
                log.info("Slurm backend auto: not pyslurm (%s); scontrol", exc)
        elif kind == "pyslurm":
            raise UnavailableError(
                f"pyslurm is not installed for {sys.executable} "
                "(pip install the pyslurm release matching this Slurm; docs/slurm.md)"
            )
    if shutil.which("scontrol") is None:
        raise UnavailableError("scontrol not found in PATH (install slurm-client)")
    return ScontrolBackend(timeout=timeout)
