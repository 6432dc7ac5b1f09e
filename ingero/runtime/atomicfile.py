"""Files replaced atomically, and untrusted files moved aside: one implementation for the
baselines, the detection state and the Slurm job files."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)


def write_atomic(path: Path, data: bytes, *, mode: int | None = None, durable: bool = True) -> None:
    """Replace ``path`` with ``data``: a reader sees the old file or the new one, never a part.

    ``durable`` also fsyncs the file and its directory so the new content survives a power
    loss (state files); job files on tmpfs skip it. ``mode`` sets the permission bits
    whatever the umask.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def quarantine(path: Path, now: float) -> Path | None:
    """Move an untrusted file aside as ``<name>.quarantined.<epoch>``; None if it cannot be."""
    target = path.with_name(f"{path.name}.quarantined.{int(now)}")
    try:
        os.replace(path, target)
    except OSError as exc:
        log.warning("cannot quarantine %s: %s", path, exc.strerror)
        return None
    return target
