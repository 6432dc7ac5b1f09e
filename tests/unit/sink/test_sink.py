"""The sink's state: counts, open episodes, parse errors, oversized lines."""

from __future__ import annotations

import json

from ingero.schema.events import Event
from ingero.sink.state import MAX_LINE_BYTES, SinkState


def line(kind: str, node: str = "n1", **kw: object) -> bytes:
    ev = Event(type=kind, node_id=node, cluster_id="c", timestamp=1.0, **kw)  # type: ignore[arg-type]
    return ev.to_json().encode()


def test_counts_and_active_stragglers() -> None:
    s = SinkState()
    s.feed(line("straggler_state"))
    s.feed(line("straggler_state", "n2"))
    s.feed(line("straggler_state"))
    s.feed(line("detection_mode"))
    assert s.stragglers == {("c", "n1"), ("c", "n2")}
    s.feed(line("straggler_resolved"))
    assert s.stragglers == {("c", "n2")}
    assert s.events == {"straggler_state": 3, "detection_mode": 1, "straggler_resolved": 1}
    assert s.parse_errors == 0


def test_bad_lines_are_counted_and_change_nothing() -> None:
    s = SinkState()
    bad = [
        b"{not json",
        b"[1,2]",
        b'"x"',
        json.dumps({"type": "straggler_state"}).encode(),
        json.dumps({"type": "nope", "node_id": "n", "cluster_id": "c", "timestamp": 1}).encode(),
        json.dumps(
            {"type": "straggler_state", "node_id": "n", "cluster_id": "c", "timestamp": "x"}
        ).encode(),
        b"\xff\xfe",
    ]
    for raw in bad:
        assert s.feed(raw) is None
    assert s.parse_errors == len(bad)
    assert s.events == {} and s.stragglers == set()
    assert s.feed(b"   ") is None and s.parse_errors == len(bad)


def test_oversized_line_dropped() -> None:
    s = SinkState()
    assert s.feed(b"x" * (MAX_LINE_BYTES + 1)) is None
    assert s.dropped == 1 and s.parse_errors == 0
