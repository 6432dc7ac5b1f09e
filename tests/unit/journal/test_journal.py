"""ingero.journal on real ``journalctl -o json`` output.

tests/unit/journal/data/journal_events.json was captured from a standalone systemd-journald (252)
after writing ``Event.journal_fields()`` of ten events over the native journal protocol,
plus journald's own start-up records and one unrelated line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ingero.cli.main import cli
from ingero.journal.episodes import DRAIN, EPISODE, EVENT_TYPES, RESUME, group
from ingero.journal.journalctl import Query
from ingero.journal.records import RecordError, field_text, parse_line
from ingero.journal.view import parse_lines, table_rows
from ingero.schema.events import MESSAGE_IDS, Event

CAPTURE = Path(__file__).with_name("data") / "journal_events.json"
T0 = 1795000000.0


def capture_lines() -> list[str]:
    return CAPTURE.read_text().splitlines()


def test_capture_parses_to_the_events_written() -> None:
    parsed = parse_lines(capture_lines())
    assert parsed.skipped == []
    assert len(parsed.events) == 9  # 12 records: 2 journald start-up lines, 1 unrelated
    first = parsed.events[0]
    assert (first.type, first.node_id, first.cluster_id, first.job_id) == (
        "straggler_state",
        "gpu01",
        "c1",
        "42",
    )
    assert first.rank == 3 and first.score == 0.61 and first.threshold == 0.8
    assert first.timestamp == T0 and first.dominant_signal == "compute"


def test_typed_extra_fields_come_back() -> None:
    events = {e.node_id: e for e in parse_lines(capture_lines()).events}
    assert events["gpu02"].extra["panic"] is True
    assert events["gpu04"].extra["peers"] == ["gpu01", "gpu02"]
    assert events["gpu04"].extra["lag_ms"] == "120"


def test_binary_and_repeated_fields() -> None:
    gpu05 = next(e for e in parse_lines(capture_lines()).events if e.node_id == "gpu05")
    assert gpu05.extra["reason"] == "ingero: line one\x1bline two"  # a byte array in JSON
    assert gpu05.job_id == "78"  # written three times: the last value counts


def test_record_roundtrips_event_journal_fields() -> None:
    event = Event(
        type="node_resumed",
        node_id="n1",
        cluster_id="c",
        job_id="9",
        rank=0,
        timestamp=T0,
        score=0.9,
        extra={"reason": "ok", "dry_run": False},
    )
    record = parse_line(json.dumps(event.journal_fields()))
    assert record is not None
    assert record.event == event


def test_grouping_into_episodes_drains_resumes() -> None:
    rows = group(parse_lines(capture_lines()).events)
    assert [(r.kind, r.node_id) for r in rows] == [
        (EPISODE, "gpu01"),
        (EPISODE, "gpu02"),
        (DRAIN, "gpu01"),
        (EPISODE, "gpu03"),
        (DRAIN, "gpu05"),
        (RESUME, "gpu01"),
    ]
    gpu01 = rows[0]
    assert (gpu01.start, gpu01.end, gpu01.events) == (T0, T0 + 95, 3)
    assert gpu01.score == 0.55 and gpu01.signal == "memory"  # the worst tick
    assert not gpu01.ongoing and not gpu01.truncated
    assert rows[1].ongoing and rows[1].panic
    assert rows[2].reason == "ingero: score 0.550 < threshold 0.790 job 42"
    assert rows[3].truncated and rows[3].end == T0 + 50


def test_duplicate_event_ids_count_once() -> None:
    events = parse_lines(capture_lines()).events
    rows = group(events + events)
    assert [r.events for r in rows if r.kind == EPISODE] == [3, 1, 1]


def test_table_cells() -> None:
    cells = table_rows(group(parse_lines(capture_lines()).events))
    assert cells[0][1:8] == ["straggler", "gpu01", "42", "1m35s", "0.550", "0.790", "memory"]
    assert cells[1][4] == "ongoing" and cells[1][8] == "panic"
    assert cells[3][4] == "ended"


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "JSON object"),
        ('{"INGERO_EVENT": "gpu_on_fire", "INGERO_NODE": "n"}', "unknown event type"),
        ('{"INGERO_EVENT": "straggler_state", "INGERO_TIMESTAMP": "1"}', "node_id"),
        (
            '{"INGERO_EVENT": "straggler_state", "INGERO_NODE": "n", "INGERO_CLUSTER": "c",'
            ' "INGERO_TIMESTAMP": "soon"}',
            "timestamp",
        ),
        (
            '{"INGERO_EVENT": "node_drained", "INGERO_NODE": "n", "INGERO_CLUSTER": "c",'
            ' "INGERO_TIMESTAMP": "1", "INGERO_RANK": "first"}',
            "rank",
        ),
        ('{"INGERO_EVENT": {"a": 1}}', "unexpected journal field"),
        ('{"INGERO_EVENT": [300, 2]}', "outside 0..255"),
    ],
)
def test_bad_records_raise_a_clear_error(line: str, why: str) -> None:
    with pytest.raises(RecordError, match=why):
        parse_line(line)


def test_bad_lines_are_skipped_and_reported_not_fatal() -> None:
    lines = ["{not json", *capture_lines(), '{"INGERO_EVENT": "nope"}', ""]
    parsed = parse_lines(lines)
    assert len(parsed.events) == 9
    assert [s.split(":")[0] for s in parsed.skipped] == ["line 1", "line 14"]


def test_non_ingero_records_are_ignored() -> None:
    assert parse_line('{"MESSAGE": "hello", "_PID": "1"}') is None


def test_realtime_timestamp_when_the_writer_gave_none() -> None:
    line = json.dumps(
        {
            "INGERO_EVENT": "node_drained",
            "INGERO_NODE": "n",
            "INGERO_CLUSTER": "c",
            "__REALTIME_TIMESTAMP": "1795000000500000",
        }
    )
    record = parse_line(line)
    assert record is not None and record.event.timestamp == 1795000000.5


def test_query_builds_journalctl_matches() -> None:
    args = Query(types=EVENT_TYPES, node="gpu01", job="42", since="-2h", unit="ingero-push").args()
    assert args[:2] == ["-o", "json"]
    assert args[args.index("--since") + 1] == "-2h"
    assert args[args.index("--unit") + 1] == "ingero-push"
    ids = [a.split("=", 1)[1] for a in args if a.startswith("MESSAGE_ID=")]
    assert ids == [MESSAGE_IDS[t] for t in EVENT_TYPES]
    assert "INGERO_NODE=gpu01" in args and "INGERO_JOB=42" in args
    assert not any(a.startswith("INGERO_CLUSTER") for a in args)


def test_field_text_forms() -> None:
    assert field_text("x") == "x"
    assert field_text([104, 105]) == "hi"
    assert field_text(["a", "b"]) == "b"
    with pytest.raises(RecordError):
        field_text(None)


def test_cli_reads_saved_output_with_filters_as_json() -> None:
    result = CliRunner().invoke(
        cli, ["events", "--input", str(CAPTURE), "--node", "gpu01", "--json"]
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["kind"] for r in rows] == [EPISODE, DRAIN, RESUME]
    assert rows[0]["duration"] == 95.0 and rows[0]["job_id"] == "42"


def test_cli_table_and_skipped_lines_on_stderr(tmp_path: Path) -> None:
    saved = tmp_path / "j.json"
    saved.write_text("garbage\n" + CAPTURE.read_text())
    result = CliRunner().invoke(cli, ["events", "--input", str(saved), "--job", "42"])
    assert result.exit_code == 0, result.output
    assert "skipped line 1: not JSON" in result.stderr
    assert "gpu01" in result.stdout and "1m35s" in result.stdout
    assert "gpu05" not in result.stdout


def test_cli_missing_input_is_one_line_error() -> None:
    result = CliRunner().invoke(cli, ["events", "--input", "/nonexistent/j.json"])
    assert result.exit_code != 0
    assert "No such file" in str(result.exception) or "No such file" in result.output


def test_operations_doc_lists_every_message_id() -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs/operations.md").read_text()
    for kind, message_id in MESSAGE_IDS.items():
        assert f"| `{kind}` | `{message_id}` |" in doc, kind


def test_fleet_skips_and_group_panics_are_rows() -> None:
    """Fleet's drain_skipped and group_degraded entries are shown, one row each."""
    skip = Event(
        type="drain_skipped",
        node_id="gpu02",
        cluster_id="c",
        timestamp=T0 + 1,
        job_id="42",
        extra={"reason": "the node's group is degraded as a whole (panic)", "skip": "panic"},
    )
    degraded = Event(
        type="group_degraded",
        node_id="",
        cluster_id="c",
        timestamp=T0,
        job_id="42",
        threshold=0.7,
        extra={"group": "job:42", "panic": True, "below_nodes": 3, "active_nodes": 4},
    )
    lines = [json.dumps(e.journal_fields()) for e in (skip, degraded)]
    rows = group(parse_lines(lines).events)
    assert [(r.kind, r.node_id) for r in rows] == [("degraded", ""), ("skip", "gpu02")]
    assert rows[0].reason == "group job:42: 3 of 4 nodes below the threshold"
    cells = table_rows(rows)
    assert cells[0][1:4] == ["degraded", "-", "42"]
    assert cells[1][8] == "the node's group is degraded as a whole (panic)"
