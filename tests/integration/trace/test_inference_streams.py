"""Replicas of one inference service judged by their decode stream's steps, on real
processes under the real tracer.

Three stand-in engines (``stream_engine.c`` run as ``vllm serve MODEL --port N``, the
command line a vLLM server has; no /metrics answers, so no token rate) step a decode stream
with a long prefill step one in ten on it, and a second stream less often. One real
``ingero trace`` records them all into one node DB; three real ``ingero fleet-push``, one
per simulated node, read it, each seeing only its own server (its ``inference.proc_root``
holds a link to that one process), and push to a real ``ingero fleet``.

Every node's ``inference_step_rate`` is its server's decode steps (1 / the mean decode step
time: prefill steps and the other stream left out), the replica whose decode steps take
twice as long is the one straggler of the service's peer group, and it recovers. The two
healthy replicas wait only through events (an event recorded on the stream, then
synchronized, as vLLM and SGLang do) and launch with config structs, the slow one through
stream syncs: the peers' rate is their decode streams', not their syncs per second.

Nodes serving several replicas each (one server per GPU): the node with one slow server
among three is the straggler against its peers (the median over its servers would read
healthy), and a lone node judges each server against the server's own baseline.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ingero.schema.events import Event
from tests.integration.push.cluster import Cluster, Procs, free_port, wait_for
from tests.integration.push.test_inference import of

pytestmark = pytest.mark.integration

NODES = 3
INTERVAL = 1.0
SERVICE = "llama-chat"
DECODE_US = 4000  # a healthy replica's decode step
DETECT_WITHIN = 60  # push intervals; the machine is shared and slow


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, Procs(), INTERVAL, NODES, fleet_config={"quorum": {"statistical_min": 3}})
    try:
        yield c
    finally:
        c.procs.stop_all()


def start_engine(
    c: Cluster, i: int, binary: Path, server: int | None = None, wait_by: str = "stream"
) -> Any:
    """Node ``i``'s engine (``server``: its server of that index, of several), its slowdown
    in ``<node>[.<server>].slow``, linked in the node's proc root; ``wait_by``: it waits for
    each step through a stream sync or an event."""
    node = c.node(i)
    tag = node if server is None else f"{node}.{server}"
    vllm = c.tmp / "bin" / "vllm"
    if not vllm.exists():
        vllm.parent.mkdir(exist_ok=True)
        vllm.symlink_to(binary)
    proc = c.procs.start(
        [str(vllm), "serve", "meta-llama/Llama-3.1-8B-Instruct", "--port", str(free_port())],
        c.tmp / f"{tag}.engine.log",
        {"STREAM_ITERS": "0", "STREAM_DECODE_US": str(DECODE_US), "STREAM_PREFILL_US": "62000",
         "STREAM_PREFILL_EVERY": "10", "STREAM_OTHER_EVERY": "5",
         "STREAM_CONTROL": str(c.tmp / f"{tag}.slow"), "STREAM_WAIT_BY": wait_by},
    )  # fmt: skip
    root = c.tmp / f"{node}.proc"
    root.mkdir(exist_ok=True)
    (root / str(proc.pid)).symlink_to(f"/proc/{proc.pid}")
    return proc


def start_nodes(
    c: Cluster, nodes: int, binary: Path, servers: int | None = None, event_nodes: int = 0
) -> None:
    """Each node's engine (``servers``: that many each; the last ``event_nodes`` nodes'
    wait on events), Fleet, the sink and each node's fleet-push, all nodes reading the one
    node DB the tracer writes."""
    for i in range(nodes):
        wait_by = "event" if i >= nodes - event_nodes else "stream"
        for j in [None] if servers is None else range(servers):
            start_engine(c, i, binary, j, wait_by)
    c.start_fleet()
    c.start_sink()
    for i in range(nodes):
        c.push_config = {
            "service": SERVICE,
            "node_db": str(c.tmp / "node.db"),
            "inference": {"proc_root": str(c.tmp / f"{c.node(i)}.proc"),
                          "metrics_timeout": "0.3s"},
        }  # fmt: skip
        c.start_push(i)


def flagged(c: Cluster) -> tuple[Event, dict[str, Any]]:
    """node00's first straggler_state (judged against its peers, no other node flagged) and
    Fleet's view of it."""
    slow = c.node(0)
    first = wait_for(
        lambda: of(c, "straggler_state", slow), DETECT_WITHIN * INTERVAL, "the slow replica"
    )[0]
    assert first.detection_mode == "fleet"
    mine = c.threshold(cluster_id="itest", service=SERVICE, node_id=slow)
    assert mine["active_nodes"] == NODES
    assert {e.node_id for e in c.events() if e.type == "straggler_state"} == {slow}
    return first, mine


def recovers(c: Cluster, first: Event, tracer: Any) -> None:
    """node00's episode ends once its slowdown is gone; no other node was ever flagged."""
    slow = c.node(0)
    resolved = wait_for(lambda: of(c, "straggler_resolved", slow), 90, "the replica recovered")
    assert resolved[0].event_id == first.event_id
    assert {e.node_id for e in c.events() if e.type == "straggler_state"} == {slow}
    for i in range(NODES):
        assert "Traceback" not in c.push_log(c.node(i))
    assert tracer.proc.poll() is None


def test_the_replica_slow_on_its_decode_stream_straggles(
    cluster: Cluster, start_tracer: Any, stream_engine: Path
) -> None:
    c = cluster
    db = c.tmp / "node.db"
    c.slow_down(0, 1.0)  # decode steps twice as long, from its first
    tracer = start_tracer(interval="0.5", db=db)
    start_nodes(c, NODES, stream_engine, event_nodes=NODES - 1)  # the slow one syncs streams
    first, mine = flagged(c)
    assert "inference_token_rate" not in mine["peer_rates"]
    # The peers' decode steps, waited on through events: 4 ms of work each (and the host's
    # time around it), within the histogram's resolution; the syncs per second of the tree
    # (decode, prefill and the other stream: about 12 in 100 ms) would read under
    # 1e6 / (2.5 * DECODE_US).
    rate = mine["peer_rates"]["inference_step_rate"]
    assert 1e6 / (1.5 * DECODE_US) < rate <= 1.25e6 / DECODE_US
    assert mine["rate_ratios"]["inference_step_rate"] == pytest.approx(0.5, abs=0.15)
    c.slow_down(0, 0.0)
    recovers(c, first, tracer)
    assert os.path.exists(db)


def test_the_node_with_one_slow_replica_of_three_straggles(
    cluster: Cluster, start_tracer: Any, stream_engine: Path
) -> None:
    c = cluster
    slow_server = c.tmp / f"{c.node(0)}.0.slow"
    slow_server.write_text("1.0")  # one of node00's three servers: decode steps 2x as long
    tracer = start_tracer(interval="0.5", db=c.tmp / "node.db")
    start_nodes(c, NODES, stream_engine, servers=3)
    first, mine = flagged(c)
    # The node's pushed rate is the median over its servers: its peers' (the slow server
    # is one of three); what flags it is its slowest server against the peers' median.
    assert mine["rate_ratios"]["inference_step_rate"] == pytest.approx(1.0, abs=0.2)
    slow_server.write_text("0")
    recovers(c, first, tracer)


@pytest.fixture
def lone(tmp_path: Path) -> Iterator[Cluster]:
    # One node: no quorum of peers, so no Fleet threshold and no peer rates; the node is
    # judged against its own baselines (detection mode local-baseline).
    c = Cluster(tmp_path, Procs(), INTERVAL, 1, fleet_config={"quorum": {"statistical_min": 3}})
    try:
        yield c
    finally:
        c.procs.stop_all()


def test_a_lone_node_judges_each_replica_against_its_own_baseline(
    lone: Cluster, start_tracer: Any, stream_engine: Path
) -> None:
    c = lone
    node = c.node(0)
    tracer = start_tracer(interval="0.5", db=c.tmp / "node.db")
    start_nodes(c, 1, stream_engine, servers=3)
    wait_for(lambda: "local-baseline" in c.modes(node), DETECT_WITHIN * INTERVAL, "local mode")
    assert not of(c, "straggler_state", node)  # three healthy replicas
    (c.tmp / f"{node}.1.slow").write_text("1.0")  # one of them slowed 2x
    first = wait_for(
        lambda: of(c, "straggler_state", node), DETECT_WITHIN * INTERVAL, "the slow replica"
    )[0]
    assert first.detection_mode == "local-baseline"
    assert "Traceback" not in c.push_log(node)
    assert tracer.proc.poll() is None
