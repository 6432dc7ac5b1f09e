"""An event as the row Echo stores it: named positions, in INSERT_EVENT's column order."""

from __future__ import annotations

from ingero.echo import rows
from ingero.schema.events import Event


def test_named_positions_follow_the_columns() -> None:
    for position, column in enumerate(rows.COLUMNS):
        assert getattr(rows, column.upper()) == position


def test_event_row_puts_each_field_at_its_position() -> None:
    ev = Event(
        "straggler_state",
        "n1",
        "c",
        12.5,
        event_id="e1",
        job_id="7",
        rank=2,
        score=0.4,
        threshold=0.8,
        detection_mode="fleet",
        dominant_signal="memory",
        extra={"panic": False},
    )
    row = rows.event_row(ev, 99.0)
    assert len(row) == len(rows.COLUMNS) == rows.INSERT_EVENT.count("?")
    assert (row[rows.EVENT_ID], row[rows.TYPE], row[rows.TS], row[rows.RECEIVED]) == (
        "e1",
        "straggler_state",
        12.5,
        99.0,
    )
    assert (row[rows.SCORE], row[rows.THRESHOLD], row[rows.DOMINANT_SIGNAL]) == (0.4, 0.8, "memory")
    assert row[rows.EXTRA] == '{"panic":false}'
