"""Detection state file: round trip, and untrusted files quarantined, never used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ingero.push.detection import CachedThreshold, LocalBaseline
from ingero.push.detection_store import MAX_BYTES, DetectionStore
from ingero.runtime.clock import ManualClock


def test_round_trip(tmp_path: Path) -> None:
    clock = ManualClock()
    store = DetectionStore(tmp_path / "s" / "d.json", "n1", clock)
    assert store.load().cached is None
    store.save(CachedThreshold(0.7, clock.now(), 3.0), LocalBaseline(0.9, 12))
    state = store.load()
    assert state.cached == CachedThreshold(0.7, clock.now())  # monotonic is not carried over
    assert state.baseline == LocalBaseline(0.9, 12)


@pytest.mark.parametrize(
    "content",
    [
        "{broken",
        json.dumps({"version": 1, "node_id": "other", "threshold": None}),
        json.dumps({"version": 99, "node_id": "n1"}),
        json.dumps({"version": 1, "node_id": "n1", "threshold": {"value": 7, "at": 0}}),
        json.dumps({"version": 1, "node_id": "n1", "threshold": {"value": 0.5, "at": 9e18}}),
        json.dumps({"version": 1, "node_id": "n1", "local": {"ema": "x"}}),
        json.dumps({"version": 1, "node_id": "n1", "local": {"ema": 0.5, "samples": -1}}),
        "x" * (MAX_BYTES + 1),
    ],
)
def test_untrusted_files_are_quarantined(tmp_path: Path, content: str) -> None:
    path = tmp_path / "d.json"
    path.write_text(content)
    state = DetectionStore(path, "n1", ManualClock()).load()
    assert state.cached is None and state.baseline == LocalBaseline()
    assert not path.exists()
    assert len(list(tmp_path.glob("d.json.quarantined.*"))) == 1
