"""A SIGHUP does not stop the node's daemons: fleet-push and the sink log it and go on.

Its default action ends a process, and systemd counts SIGHUP as a clean exit, so
``Restart=on-failure`` would not bring the unit back: a stray ``pkill -HUP ingero`` would
have stopped a node's pusher for good. ``ingero trace`` installs the same handler
(``ingero.runtime.hangup.ignore_hangups``, first thing in each command)."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.push.cluster import Cluster, Procs, wait_for

pytestmark = pytest.mark.integration

INTERVAL = 0.5


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    procs = Procs()
    c = Cluster(tmp_path, procs, INTERVAL, 1)
    try:
        yield c
    finally:
        procs.stop_all()


def test_sighup_is_logged_and_the_node_goes_on_pushing(cluster: Cluster) -> None:
    c = cluster
    c.start_fleet()
    c.start_sink()
    sink = c.procs.running[-1]
    c.start_workload(0)
    push = c.start_push(0)

    def pushes() -> float:
        return c.fleet_metric("ingero_fleet_requests_total", signal="metrics", code="200")

    wait_for(lambda: pushes() >= 2, 60, "the first pushes")
    # A SIGHUP before logging is set up (the command's first line) would be lost silently:
    # these come once the daemons run, each must be logged and survived.
    for proc in (push, sink):
        proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "fleet-push: SIGHUP ignored" in c.push_log(c.node(0)), 30, "fleet-push's line")
    before = pushes()
    wait_for(lambda: pushes() >= before + 3, 60, "pushes after the SIGHUP")
    time.sleep(INTERVAL)
    assert push.poll() is None and sink.poll() is None
    assert "sink: SIGHUP ignored" in c.events_file.read_text(errors="replace")
