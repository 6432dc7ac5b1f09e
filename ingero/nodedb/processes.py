"""Reads of the ``processes`` table: each traced process with its Slurm job and rank."""

from __future__ import annotations

from typing import Any

import sqlite_utils


def recent(db: sqlite_utils.Database, job_id: str | None) -> list[Any]:
    """(pid, comm, job_id, rank, last_seen) of the traced processes (of ``job_id`` when
    given), most recently seen first, at most 50."""
    job_sql, job_args = ("WHERE job_id = ?", (job_id,)) if job_id else ("", ())
    return db.execute(
        f"SELECT pid, comm, job_id, rank, last_seen FROM processes {job_sql}"
        " ORDER BY last_seen DESC, pid LIMIT 50",
        job_args,
    ).fetchall()


def job_ranks(db: sqlite_utils.Database, job_id: str | None, limit: int) -> list[Any]:
    """(pid, rank) of the processes of ``job_id`` (any job when None), most recently seen
    first, at most ``limit``."""
    return db.conn.execute(
        "SELECT pid, rank FROM processes WHERE (? IS NULL OR job_id = ?)"
        " ORDER BY last_seen DESC LIMIT ?",
        (job_id, job_id, limit),
    ).fetchall()
