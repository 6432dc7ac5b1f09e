"""Fleet's audit log in a real journald: accepted requests by token name and hash prefix
(never the token), refusals by reason and source, counts aggregated per window so a flood
writes a bounded number of entries; and the open-listener warning, with its own MESSAGE_ID."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from ingero.security.audit import AUDIT_MESSAGE_ID, OPEN_LISTENER_MESSAGE_ID
from tests.integration.journald_harness import run_with_journald, unavailable

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "audit-token-0123456789abcdef"
GOOD = 2000

pytestmark = pytest.mark.integration

SCRIPT = r"""
import http.client, sys
from ingero.fleet.config import AuthConfig, FleetConfig, ListenConfig
from ingero.fleet.daemon import FleetDaemon
from ingero.otlp.health import NodePush
from tests.integration.fleet.helpers import health_request

token_file, good = sys.argv[1], int(sys.argv[2])
loopback = ListenConfig("127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0")
fleet = FleetDaemon(FleetConfig(listen=loopback, auth=AuthConfig(token_file=token_file)))
bound = fleet.start()
host, _, port = bound.otlp_http.rpartition(":")
body = health_request([NodePush(node_id="n", cluster_id="c", score=0.9)]).SerializeToString()
conn = http.client.HTTPConnection(host, int(port), timeout=10)
def post(auth):
    global conn
    headers = {"Content-Type": "application/x-protobuf", **({"Authorization": auth} if auth else {})}
    conn.request("POST", "/v1/metrics", body, headers)
    response = conn.getresponse()
    response.read()
    if response.getheader("Connection") == "close":
        conn.close()
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
    return response.status
statuses = [post("Bearer " + open(token_file).read().strip()) for _ in range(good)]
statuses += [post("Bearer wrong-guess") for _ in range(3)] + [post(None) for _ in range(2)]
fleet.stop()
assert statuses == [200] * good + [401] * 5, sorted(set(statuses))
# a token-less Fleet on every address: the warning
open_ = FleetDaemon(FleetConfig(listen=ListenConfig("127.0.0.1:0", "0.0.0.0:0", "127.0.0.1:0")))
open_.start()
open_.stop()
"""


def test_audit_entries_in_journald(tmp_path: Path) -> None:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    token_file = tmp_path / "node-token"
    token_file.write_text(TOKEN + "\n")
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    command = (
        f"cd {ROOT} && PYTHONPATH={ROOT} {sys.executable} {script} {token_file} {GOOD} "
        "|| exit 1; journalctl --sync 2>/dev/null; "
        f"journalctl -o json --all --no-pager MESSAGE_ID={AUDIT_MESSAGE_ID} "
        f"+ MESSAGE_ID={OPEN_LISTENER_MESSAGE_ID}"
    )
    result = run_with_journald(["bash", "-c", command], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert TOKEN not in result.stdout  # never the token itself
    entries = [json.loads(line) for line in result.stdout.splitlines()]
    audit = [e for e in entries if e["MESSAGE_ID"] == AUDIT_MESSAGE_ID]
    accepted = [e for e in audit if e["INGERO_OUTCOME"] == "accepted"]
    assert sum(int(e["INGERO_COUNT"]) for e in accepted) == GOOD
    # aggregated per 1 s window: a few entries for 2000 requests, not 2000
    assert 1 <= len(accepted) < GOOD / 20
    tid = hashlib.sha256(TOKEN.encode()).hexdigest()[:12]
    assert {(e["INGERO_TOKEN_NAME"], e["INGERO_TOKEN_ID"]) for e in accepted} == {
        ("node-token", tid)
    }
    assert {e["INGERO_LISTENER"] for e in accepted} == {"otlp-http"}
    assert {e["PRIORITY"] for e in accepted} == {"6"}
    refused: dict[str, int] = {}
    for e in audit:
        if e["INGERO_OUTCOME"] == "refused":
            assert e["INGERO_SOURCE"] == "127.0.0.1" and e["PRIORITY"] == "4"
            refused[e["INGERO_REASON"]] = refused.get(e["INGERO_REASON"], 0) + int(
                e["INGERO_COUNT"]
            )
    assert refused == {"unknown_token": 3, "missing_token": 2}
    wrong = [e for e in audit if e.get("INGERO_REASON") == "unknown_token"]
    assert {e["INGERO_TOKEN_ID"] for e in wrong} == {
        hashlib.sha256(b"wrong-guess").hexdigest()[:12]
    }
    warnings = [e for e in entries if e["MESSAGE_ID"] == OPEN_LISTENER_MESSAGE_ID]
    assert len(warnings) == 1
    assert "otlp_http 0.0.0.0:" in warnings[0]["MESSAGE"] and warnings[0]["PRIORITY"] == "4"
