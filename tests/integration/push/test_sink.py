"""The real ``ingero sink``: several writers, bad lines counted, /metrics, clean stop."""

from __future__ import annotations

import json
import signal
import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ingero.schema.events import Event
from tests.integration.push.cluster import Procs, free_port, ingero, wait_for

pytestmark = pytest.mark.integration


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def reachable(port: int) -> bool:
    try:
        scrape(port)
    except OSError:
        return False
    return True


def test_sink_counts_events_stragglers_and_bad_lines(tmp_path: Path, procs: Procs) -> None:
    sock_path, port = tmp_path / "ev.sock", free_port()
    out = tmp_path / "sink.out"
    proc = procs.start(
        ingero("sink", "--socket", str(sock_path), "--metrics", f"127.0.0.1:{port}", "--print"),
        out,
    )
    wait_for(lambda: sock_path.exists(), 30, "the sink socket")
    wait_for(lambda: reachable(port), 30, "the sink's /metrics")

    def event(kind: str, node: str) -> bytes:
        ev = Event(type=kind, node_id=node, cluster_id="c1", timestamp=1.0)
        return ev.to_json().encode() + b"\n"

    a = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    b = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    a.connect(str(sock_path))
    b.connect(str(sock_path))
    a.sendall(event("straggler_state", "n1") + b"{not json}\n" + event("straggler_state", "n2"))
    # A line split across writes, an event missing fields, an oversized line, binary junk.
    line = event("straggler_resolved", "n1")
    b.sendall(line[:10])
    b.sendall(line[10:] + b'{"type":"straggler_state"}\n' + b"x" * 70000 + b"\n\xff\xfe\n")
    a.close()
    b.close()

    def settled() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
        m = scrape(port)
        done = m.get(("ingero_sink_parse_errors_total", ()), 0) >= 3
        return m if done and m.get(("ingero_sink_dropped_total", ()), 0) >= 1 else None

    m = wait_for(settled, 30, "the sink to count every line")
    assert m[("ingero_sink_events_total", (("type", "straggler_state"),))] == 2
    assert m[("ingero_sink_events_total", (("type", "straggler_resolved"),))] == 1
    assert m[("ingero_sink_parse_errors_total", ())] == 3
    assert m[("ingero_sink_dropped_total", ())] == 1
    active = {
        dict(labels)["node_id"]
        for (name, labels), value in m.items()
        if name == "ingero_sink_active_stragglers" and value == 1
    }
    assert active == {"n2"}
    assert Procs.stop(proc, signal.SIGTERM) == 0
    printed = [json.loads(x) for x in out.read_text().splitlines() if x.startswith("{")]
    assert sorted(e["node_id"] for e in printed) == ["n1", "n1", "n2"]
    assert not sock_path.exists()


def test_sink_refuses_a_bad_metrics_address(tmp_path: Path, procs: Procs) -> None:
    proc = procs.start(
        ingero("sink", "--socket", str(tmp_path / "ev.sock"), "--metrics", "nowhere"),
        tmp_path / "sink.log",
    )
    assert proc.wait(timeout=30) == 2
    assert "HOST:PORT" in (tmp_path / "sink.log").read_text()
    assert not (tmp_path / "ev.sock").exists()
