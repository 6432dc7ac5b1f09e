"""The node DB's side file: the node's newest stack snapshot, kept beside the DB for
``ingero explain``.

fleet-push sends each ``stack_snapshot`` event on its channels and also writes it, whole,
to ``<node DB>-snapshot.json`` (the way SQLite names its own ``-wal`` beside the DB), so
``ingero explain`` on the node, and ``explain --job-nodes`` through it, shows where the
job's processes were without asking Fleet or Echo. One file, replaced atomically by each
snapshot: its size is one event's (bounded by the snapshot's ``max_bytes``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ingero.schema.events import snapshot_line
from ingero.schema.stacks import StackError, stack_from_json

SUFFIX = "-snapshot.json"
# A file bigger than any event fleet-push writes is not one of its snapshots.
MAX_BYTES = 64 * 1024


def path_for(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + SUFFIX)


def write(db_path: Path, event: dict[str, Any]) -> None:
    """Replace the kept snapshot with ``event`` (its flat dict); OSError when it cannot."""
    path = path_for(db_path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(event, separators=(",", ":"), allow_nan=False))
    os.replace(tmp, path)


def read(db_path: Path) -> dict[str, Any] | None:
    """The kept snapshot, or None when there is none or it is not one."""
    path = path_for(db_path)
    try:
        if path.stat().st_size > MAX_BYTES:
            return None
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("type") != "stack_snapshot":
        return None
    if not isinstance(data.get("timestamp"), int | float):
        return None
    return data


def describe(data: dict[str, Any]) -> str:
    """The snapshot's answer in one line, from its first thread with frames (the node puts
    the most telling first); with none, why."""
    entries = [e for e in data.get("stacks") or () if isinstance(e, dict)]
    for entry in sorted(entries, key=lambda e: not e.get("frames")):
        try:
            stack = stack_from_json(entry)
        except StackError:
            continue
        rank = entry.get("rank", data.get("rank"))
        return snapshot_line(
            data.get("trigger"),
            data.get("op"),
            data.get("seq"),
            rank,
            str(data.get("node_id")),
            stack.summary(),
            data.get("for_s"),
        )
    reason = data.get("reason") or "no thread could be read"
    return f"stack snapshot of node {data.get('node_id')}: {reason}"


def recent(db_path: Path, since: float, job_id: str | None) -> dict[str, Any] | None:
    """The kept snapshot when taken at or after ``since`` (of ``job_id`` when given)."""
    data = read(db_path)
    if data is None or float(data["timestamp"]) < since:
        return None
    if job_id is not None and data.get("job_id") != job_id:
        return None
    return data
