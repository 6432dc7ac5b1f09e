"""Read ingero events from journal JSON lines and render the grouped rows for a person."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from ingero.journal.episodes import EPISODE, Row
from ingero.journal.records import RecordError, parse_line
from ingero.schema.events import Event


@dataclass
class Parsed:
    events: list[Event] = field(default_factory=list)
    # malformed or foreign-looking lines, with why: reported, never fatal
    skipped: list[str] = field(default_factory=list)


def parse_lines(lines: Iterable[str]) -> Parsed:
    out = Parsed()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = parse_line(line)
        except RecordError as exc:
            out.skipped.append(f"line {number}: {exc}")
            continue
        if record is not None:
            out.events.append(record.event)
    return out


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def table_rows(rows: Iterable[Row]) -> list[list[str]]:
    """Text cells: when, what, node, job, duration, score, threshold, signal, detail."""
    cells = []
    for row in rows:
        if row.kind == EPISODE:
            if row.truncated:
                duration = "ended"
            elif row.end is None:
                duration = "ongoing"
            else:
                duration = _duration(row.end - row.start)
        else:
            duration = ""
        detail = row.reason or ""
        if row.panic:
            detail = ("panic; " + detail).rstrip("; ")
        cells.append(
            [
                _when(row.start),
                row.kind,
                row.node_id or "-",  # group_degraded is about a group, not a node
                row.job_id or "-",
                duration,
                _figure(row.score),
                _figure(row.threshold),
                row.signal or "-",
                detail,
            ]
        )
    return cells


HEADERS = ["when", "what", "node", "job", "duration", "score", "threshold", "signal", "detail"]


def to_json(rows: Iterable[Row]) -> str:
    return json.dumps([r.to_dict() for r in rows], indent=2)
