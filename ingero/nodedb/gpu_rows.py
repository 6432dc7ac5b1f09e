"""The ``gpu_intervals`` rows of a recent stretch, read with plain sqlite3: ``ingero check
--health`` (run by NHC as Slurm's HealthCheckProgram) reads them, and sqlite-utils, which
loads numpy, would cost 150 ms of NHC's 30 s for nothing. So this module imports nothing
of the node DB package but its version (``ingero.nodedb.SCHEMA_VERSION``).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from ingero.nodedb import SCHEMA_VERSION


class NodeDbTooNew(Exception):
    """The node DB is from a newer ingero (readers refuse a newer version)."""


def read_gpu_rows(path: Path, since: float, timeout_s: float = 2.0) -> list[dict[str, Any]]:
    """``gpu_intervals`` rows ending after ``since``, read-only, the busy wait bounded.
    Raises OSError, sqlite3.Error or NodeDbTooNew; the caller notes them."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: node DB does not exist")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=timeout_s)
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise NodeDbTooNew(f"{path}: schema version {version} is newer than {SCHEMA_VERSION}")
        cursor = conn.execute("SELECT * FROM gpu_intervals WHERE ts_end > ?", (since,))
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor]
    finally:
        conn.close()
