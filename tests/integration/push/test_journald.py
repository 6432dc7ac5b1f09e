"""Events written by fleet-push's journald channel arrive in a real journald with their fields."""

from __future__ import annotations

import json
import sys

import pytest

from ingero.events import MESSAGE_IDS
from tests.integration.journald_harness import run_with_journald, unavailable

pytestmark = pytest.mark.integration

WRITER = r"""
import json, sys
from ingero.events import Event
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
    assert state["INGERO_RANK"] == "7" and state["INGERO_PANIC"] == "True"
    assert state["INGERO_DETECTION_MODE"] == "fleet-cached"
    assert state["PRIORITY"] == "4"
    assert state["INGERO_REASON"] == "line one\nline two"
    resolved = by_id[written["ids"][1]]
    assert resolved["MESSAGE_ID"] == MESSAGE_IDS["straggler_resolved"]
    big = by_id[written["ids"][2]]  # too large for a datagram: went through a memfd
    assert big["MESSAGE_ID"] == MESSAGE_IDS["detection_mode"]
    assert big["INGERO_BLOB"] == "x" * 400000
