"""Reads of the ``marks`` table (node DB v5): what the job marked through ``ingero
annotate``. Written by :mod:`ingero.nodedb.writer` (the annotate server's batches)."""

from __future__ import annotations

from typing import Any

import sqlite_utils

from ingero.nodedb.tables import job_filter


def phases(
    db: sqlite_utils.Database, start: float, end: float, job_id: str | None, limit: int
) -> list[Any]:
    """(name, pid, rank, ts_start, ts_end) of the phases that overlap ``(start, end]``
    (``ts_end`` NULL: still open), the latest first, at most ``limit``; none before v5."""
    if "marks" not in db.table_names():
        return []
    job_sql, job_args = job_filter(job_id)
    return db.execute(
        "SELECT name, pid, rank, ts_start, ts_end FROM marks WHERE kind = 'phase'"
        f" AND ts_start <= ? AND (ts_end IS NULL OR ts_end > ?) {job_sql}"
        " ORDER BY ts_start DESC LIMIT ?",
        (end, start, *job_args, limit),
    ).fetchall()
