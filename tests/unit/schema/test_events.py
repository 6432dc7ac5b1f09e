"""The shared event schema: parsing, JSON, and journald fields."""

from __future__ import annotations

import json

import pytest

from ingero.schema.events import MESSAGE_IDS, Event


def straggler(**extra: object) -> Event:
    return Event(
        type="straggler_state",
        node_id="n1",
        cluster_id="c1",
        timestamp=1_700_000_000.0,
        job_id="42",
        rank=3,
        score=0.41,
        threshold=0.87,
        detection_mode="fleet",
        dominant_signal="throughput",
        extra=dict(extra),
    )


def test_round_trip_through_json_keeps_every_field_and_extra() -> None:
    event = straggler(panic=True)
    back = Event.from_dict(json.loads(event.to_json()))
    assert back == event
    assert back.extra == {"panic": True}


def test_extra_cannot_shadow_schema_fields() -> None:
    assert straggler(node_id="evil").to_dict()["node_id"] == "n1"


def test_journal_fields_carry_message_id_and_ingero_names() -> None:
    fields = straggler(panic=True).journal_fields()
    assert fields["MESSAGE_ID"] == MESSAGE_IDS["straggler_state"]
    assert fields["INGERO_EVENT"] == "straggler_state"
    assert (fields["INGERO_NODE"], fields["INGERO_CLUSTER"], fields["INGERO_JOB"]) == (
        "n1",
        "c1",
        "42",
    )
    assert fields["INGERO_RANK"] == "3"
    assert fields["INGERO_PANIC"] == "true"
    assert fields["PRIORITY"] == "4"
    assert "score=0.410 threshold=0.870" in fields["MESSAGE"]


def test_group_event_without_node_writes_no_empty_node_field() -> None:
    event = Event(type="group_degraded", node_id="", cluster_id="c1", timestamp=1.0)
    assert "INGERO_NODE" not in event.journal_fields()


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"type": "straggler_state", "node_id": "n"}, "missing cluster_id, timestamp"),
        ({"type": "nope", "node_id": "n", "cluster_id": "c", "timestamp": 1}, "unknown event type"),
        ({"type": "straggler_state", "node_id": 5, "cluster_id": "c", "timestamp": 1}, "node_id"),
        (
            {"type": "straggler_state", "node_id": "n", "cluster_id": "c", "timestamp": "x"},
            "timestamp",
        ),
        (
            {
                "type": "straggler_state",
                "node_id": "n",
                "cluster_id": "c",
                "timestamp": 1,
                "score": float("nan"),
            },
            "score",
        ),
        (
            {
                "type": "straggler_state",
                "node_id": "n",
                "cluster_id": "c",
                "timestamp": 1,
                "rank": "2",
            },
            "rank",
        ),
        (
            {
                "type": "straggler_state",
                "node_id": "n",
                "cluster_id": "c",
                "timestamp": 1,
                "event_id": "x",
            },
            "UUID",
        ),
        ({"type": "straggler_state", "node_id": "", "cluster_id": "c", "timestamp": 1}, "node_id"),
        (
            {
                "type": "straggler_state",
                "node_id": "n",
                "cluster_id": "c",
                "timestamp": 1,
                "x": float("inf"),
            },
            "finite JSON",
        ),
        # stored as text columns: a map or number there made Echo's commit fail (a 503)
        (
            {
                "type": "straggler_state",
                "node_id": "n",
                "cluster_id": "c",
                "timestamp": 1,
                "dominant_signal": {"a": 1},
            },
            "dominant_signal must be a string",
        ),
        (
            {
                "type": "straggler_state",
                "node_id": "n",
                "cluster_id": "c",
                "timestamp": 1,
                "detection_mode": 3,
            },
            "detection_mode must be a string",
        ),
    ],
)
def test_bad_events_are_refused_with_the_field_named(data: dict[str, object], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        Event.from_dict(data)


def test_parse_fast_paths_accept_and_normalise_what_the_general_checks_do() -> None:
    event_id = "6F3C2A1E-9B8D-4C7A-8E5F-0A1B2C3D4E51"
    base = {"type": "peer_lag", "node_id": "n", "cluster_id": "c", "timestamp": 5}
    for spelling in (
        event_id,
        "{" + event_id + "}",
        "urn:uuid:" + event_id,
        event_id.replace("-", ""),
    ):
        assert Event.from_dict({**base, "event_id": spelling}).event_id == spelling
    ev = Event.from_dict({**base, "job_id": 42, "score": 1, "peer": "n2", "n": 3, "ok": True})
    assert (ev.timestamp, ev.score, ev.job_id) == (5.0, 1.0, "42")
    assert type(ev.timestamp) is float and type(ev.score) is float
    assert ev.extra == {"peer": "n2", "n": 3, "ok": True}
    with pytest.raises(ValueError, match="finite JSON"):
        Event.from_dict({**base, "lags": {"n2": float("nan")}})
    with pytest.raises(ValueError, match="finite JSON"):
        Event.from_dict({**base, "blob": object()})
    with pytest.raises(ValueError, match="timestamp"):
        Event.from_dict({**base, "timestamp": True})


BASE = {"type": "peer_lag", "node_id": "n", "cluster_id": "c", "timestamp": 5}


# from_dict copies a dict with no extras in one step and splits the others in a loop: both
# normalise alike, leave the caller's dict as it was, and send unknown keys to extra.
@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (BASE, {**BASE, "timestamp": 5.0}),
        ({**BASE, "job_id": 42, "rank": 0}, {**BASE, "timestamp": 5.0, "job_id": "42", "rank": 0}),
        (
            {**BASE, "score": 0, "threshold": 0.0},
            {**BASE, "timestamp": 5.0, "score": 0.0, "threshold": 0.0},
        ),
        ({**BASE, "job_id": 42, "n": 0}, {**BASE, "timestamp": 5.0, "job_id": "42", "n": 0}),
        ({**BASE, "extra": {"a": 1}}, {**BASE, "timestamp": 5.0, "extra": {"a": 1}}),
        ({**BASE, "ok": False, "why": ""}, {**BASE, "timestamp": 5.0, "ok": False, "why": ""}),
    ],
)
def test_from_dict_with_and_without_extras(
    data: dict[str, object], expected: dict[str, object]
) -> None:
    before = json.dumps(data)
    event = Event.from_dict(data)
    assert json.dumps(data) == before
    got = {k: v for k, v in event.to_dict().items() if k != "event_id" and v is not None}
    assert got == expected
    assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in expected.items()}
