"""Events written by fleet-push's journald channel arrive in a real journald with their fields."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ingero.schema.events import MESSAGE_IDS
from tests.integration.journald_harness import run_with_journald, unavailable

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.integration

WRITER = r"""
import json, sys
from ingero.schema.events import Event
from ingero.push.channels.journald import JournaldChannel
ch = JournaldChannel()
sent = []
for kind, extra in [("straggler_state", {"panic": True, "reason": "line one\nline two"}),
                    ("straggler_resolved", {"reason": "recovered"}),
                    ("detection_mode", {"previous_mode": "fleet", "blob": "x" * 400000})]:
    ev = Event(type=kind, node_id="gpu-07", cluster_id="c1", timestamp=1700000000.5,
               job_id="4242", rank=7, score=0.41, threshold=0.7, detection_mode="fleet-cached",
               dominant_signal="throughput", extra=extra)
    ch.send(ev)
    sent.append(ev.event_id)
print(json.dumps({"ids": sent, "stats": ch.stats()}))
"""


def test_events_arrive_with_message_id_and_ingero_fields() -> None:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    script = (
        f"{sys.executable} -c '{WRITER}' && "
        "journalctl --sync 2>/dev/null; journalctl -o json --all --no-pager SYSLOG_IDENTIFIER=ingero"
    )
    result = run_with_journald(["bash", "-c", script])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    written = json.loads(lines[0])
    assert written["stats"] == {"sent": 3, "dropped": 0, "errors": 0}
    entries = [json.loads(line) for line in lines[1:]]
    by_id = {e["INGERO_EVENT_ID"]: e for e in entries}
    assert sorted(by_id) == sorted(written["ids"])
    state = by_id[written["ids"][0]]
    assert state["MESSAGE_ID"] == MESSAGE_IDS["straggler_state"]
    assert state["INGERO_EVENT"] == "straggler_state"
    assert (state["INGERO_NODE"], state["INGERO_CLUSTER"], state["INGERO_JOB"]) == (
        "gpu-07",
        "c1",
        "4242",
    )
    assert state["INGERO_RANK"] == "7" and state["INGERO_PANIC"] == "true"
    assert state["INGERO_DETECTION_MODE"] == "fleet-cached"
    assert state["PRIORITY"] == "4"
    assert state["INGERO_REASON"] == "line one\nline two"
    resolved = by_id[written["ids"][1]]
    assert resolved["MESSAGE_ID"] == MESSAGE_IDS["straggler_resolved"]
    big = by_id[written["ids"][2]]  # too large for a datagram: went through a memfd
    assert big["MESSAGE_ID"] == MESSAGE_IDS["detection_mode"]
    assert big["INGERO_BLOB"] == "x" * 400000


def test_the_agent_writes_to_the_default_journal_socket(tmp_path: Path) -> None:
    """``ingero fleet-push`` as a process, default journal path: its mode change is logged."""
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    query = (
        f"journalctl -o json --no-pager MESSAGE_ID={MESSAGE_IDS['detection_mode']}"
        " INGERO_NODE=jd-node"
    )
    # The agent runs until its entry is in the journal (at most 120 s), not a fixed time: on
    # a loaded host its start alone took more than the 4 s this once allowed.
    push = (
        f"{sys.executable} -m ingero.cli.main fleet-push"
        f" --endpoint http://127.0.0.1:1 --node-id jd-node --cluster-id jd"
        f" --node-db {tmp_path}/none.db --state-dir {tmp_path}/state"
        f" --event-socket {tmp_path}/ev.sock --push-interval 1s > {tmp_path}/push.log 2>&1 &"
        f' pid=$!; for _ in $(seq 1200); do [ -n "$({query})" ] && break; sleep 0.1; done;'
        " kill -TERM $pid; wait $pid;"
    )
    result = run_with_journald(["bash", "-c", push + query], cwd=ROOT)
    assert result.returncode == 0, result.stderr + (tmp_path / "push.log").read_text()
    entries = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(entries) == 1, (tmp_path / "push.log").read_text()
    entry = entries[0]
    assert entry["INGERO_EVENT"] == "detection_mode"
    assert entry["INGERO_DETECTION_MODE"] == "none"
    assert entry["INGERO_CLUSTER"] == "jd"
    assert entry["SYSLOG_IDENTIFIER"] == "ingero"


SNAPSHOT_WRITER = r"""
import json
from ingero.schema.events import Event
from ingero.push.channels.journald import JournaldChannel
frames = [{"kind": "py", "function": "read", "file": "data/loader.py", "line": 212},
          {"kind": "py", "function": "__next__", "file": "data/loader.py", "line": 88}]
ev = Event(type="stack_snapshot", node_id="gpu-07", cluster_id="c1", timestamp=1700000000.5,
           event_id="9d1c2b3a-0d7b-4f4e-9b7e-1c2d3e4f5a6b", job_id="4242", rank=5,
           extra={"trigger": "collective_hang", "op": "ncclAllReduce", "seq": 9001,
                  "for_s": 45.2, "stacks": [{"pid": 3121, "rank": 5, "frames": frames}]})
JournaldChannel().send(ev)
"""


def test_a_stack_snapshot_reads_as_one_line_in_journalctl() -> None:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    script = (
        f"{sys.executable} -c '{SNAPSHOT_WRITER}' && journalctl --sync 2>/dev/null;"
        " journalctl -o json --all --no-pager INGERO_EVENT=stack_snapshot"
    )
    result = run_with_journald(["bash", "-c", script])
    assert result.returncode == 0, result.stderr
    (entry,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert entry["MESSAGE_ID"] == MESSAGE_IDS["stack_snapshot"] and entry["PRIORITY"] == "4"
    assert entry["MESSAGE"] == (
        "ingero stack_snapshot: node gpu-07 job 4242 collective_hang in ncclAllReduce #9001"
        " for 45 s: rank 5 pid 3121 in read at data/loader.py:212 ← __next__ at"
        " data/loader.py:88"
    )
    assert entry["INGERO_EVENT_ID"] == "9d1c2b3a-0d7b-4f4e-9b7e-1c2d3e4f5a6b"
    assert json.loads(entry["INGERO_STACKS"])[0]["frames"][0]["line"] == 212
