"""Fleet tokens scoped to clusters: the one check both OTLP transports share, the scopes'
configuration, and the receiver refusing a request whole before anything is ingested."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingero.fleet.config import FleetConfig
from ingero.fleet.events import EventQueue
from ingero.fleet.metrics import FleetMetrics
from ingero.fleet.receiver import Receiver
from ingero.fleet.scope import CLUSTER_NOT_ALLOWED, check_scope, scoped_tokens
from ingero.fleet.state import FleetState
from ingero.otlp.health import NodePush, encode_health
from ingero.otlp.logs import encode_events
from ingero.otlp.receiver import RequestError
from ingero.runtime.clock import ManualClock
from ingero.runtime.config import load_config
from ingero.runtime.errors import ConfigError
from ingero.runtime.journald import JournalWriter
from ingero.schema.events import Event
from ingero.security.access import Gate
from ingero.security.audit import AUDIT_MESSAGE_ID, REFUSED, AuditLog
from ingero.security.bearer import Identity, Keyring, NamedToken, digest
from ingero.security.ratelimit import RateLimitConfig
from ingero.security.scope import ClusterScope, outside_scope

RACK_A = frozenset({"A", "A2"})


@pytest.mark.parametrize(
    ("scope", "clusters", "outside"),
    [
        (None, ["A", "B", "anything"], None),  # unscoped: every cluster
        (RACK_A, ["A"], None),
        (RACK_A, ["A", "A2", "A"], None),
        (RACK_A, ["B"], "B"),
        (RACK_A, ["A", "B", "C"], "B"),  # mixed resources: the first outside is named
        (RACK_A, [], None),  # nothing claimed, nothing to refuse
        (frozenset({"a"}), ["A"], "A"),  # ids are compared exactly
    ],
)
def test_outside_scope(scope: ClusterScope, clusters: list[str], outside: str | None) -> None:
    assert outside_scope(scope, clusters) == outside


def test_an_unscoped_token_never_looks_at_the_clusters() -> None:
    def never() -> Iterator[str]:
        raise AssertionError("iterated")
        yield ""  # pragma: no cover

    assert outside_scope(None, never()) is None
    check_scope(Identity("ops", "0123456789ab", None), never())
    check_scope(None, never())  # authentication off


def test_check_scope_refuses_with_a_403_naming_token_and_cluster() -> None:
    rack = Identity("rack-a", "0123456789ab", RACK_A)
    check_scope(rack, ["A", "A2"])
    with pytest.raises(RequestError) as refused:
        check_scope(rack, ["A", "B"])
    assert refused.value.status == 403 and refused.value.reason == CLUSTER_NOT_ALLOWED
    assert str(refused.value) == "token rack-a may not push for cluster B"


def named(*names: str) -> list[NamedToken[None]]:
    return [NamedToken(n, digest(f"token-of-{n}"), None) for n in names]


def test_scoped_tokens_attach_scopes_by_name() -> None:
    tokens = scoped_tokens(named("rack-a", "ops"), {"rack-a": ["A", "A2"]})
    assert {t.name: t.payload for t in tokens} == {"rack-a": RACK_A, "ops": None}


def test_a_scope_for_no_such_token_is_an_error_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"no token is named 'rack-b'.*: ops, rack-a\)$"):
        scoped_tokens(named("rack-a", "ops"), {"rack-a": ["A"], "rack-b": ["B"]})
    with pytest.raises(ConfigError, match=r"'rack-a'.*: none\)$"):
        scoped_tokens([], {"rack-a": ["A"]})


def write_config(tmp: Path, text: str) -> Path:
    path = tmp / "fleet.yaml"
    path.write_text(text)
    return path


def test_config_token_clusters(tmp_path: Path) -> None:
    assert load_config(FleetConfig, "fleet", write_config(tmp_path, "{}")).auth.token_clusters == {}
    path = write_config(tmp_path, "auth:\n  token_clusters:\n    rack-a: [A, A2]\n")
    assert load_config(FleetConfig, "fleet", path).auth.token_clusters == {"rack-a": ["A", "A2"]}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{rack-a: []}", "auth.token_clusters.rack-a: an empty list would refuse every push"),
        ("{rack-a: ['']}", "auth.token_clusters.rack-a: a cluster id is empty"),
        ("{rack-a: A}", "auth.token_clusters: expected a list, got 'A'"),
        ("[rack-a]", "auth.token_clusters: expected a mapping"),
    ],
)
def test_config_token_clusters_errors(tmp_path: Path, text: str, message: str) -> None:
    path = write_config(tmp_path, f"auth:\n  token_clusters: {text}\n")
    with pytest.raises(ConfigError) as error:
        load_config(FleetConfig, "fleet", path)
    assert message in str(error.value) and "\n" not in str(error.value)


def receiver() -> tuple[Receiver, FleetState, EventQueue, list[Event]]:
    clock = ManualClock(1_700_000_000.0)
    metrics = FleetMetrics(None)
    state = FleetState(FleetConfig(), clock)
    events = EventQueue(metrics)
    delivered: list[Event] = []
    events.add_sink(delivered.extend, "test")
    return Receiver(state, metrics, events, clock), state, events, delivered


def push(node: str, cluster: str) -> NodePush:
    return NodePush(node_id=node, cluster_id=cluster, score=0.9)


def event(node: str, cluster: str) -> Event:
    return Event(type="straggler_state", node_id=node, cluster_id=cluster, timestamp=1.0)


def test_receiver_refuses_a_mixed_request_whole_and_ingests_nothing_of_it() -> None:
    recv, state, events, delivered = receiver()
    rack = Identity("rack-a", "0123456789ab", RACK_A)
    mixed = encode_health(push("a1", "A"), 1)
    mixed.resource_metrics.extend(encode_health(push("b1", "B"), 1).resource_metrics)
    with pytest.raises(RequestError, match="token rack-a may not push for cluster B"):
        recv.request("metrics", mixed, rack)
    assert state.node_count() == 0  # not even the node of A
    with pytest.raises(RequestError, match="cluster B"):
        recv.request("logs", encode_events([event("a1", "A"), event("b1", "B")]), rack)
    events.deliver()
    assert delivered == []
    # within the scope, or an unscoped token: ingested
    assert recv.request("metrics", encode_health(push("a1", "A"), 2), rack).accepted == 1
    ops = Identity("ops", "ba9876543210", None)
    assert recv.request("metrics", encode_health(push("b1", "B"), 2), ops).accepted == 1
    assert recv.request("logs", encode_events([event("b1", "B")]), ops).accepted == 1
    assert state.node_count() == 2
    events.deliver()
    assert [(e.node_id, e.cluster_id) for e in delivered] == [("b1", "B")]


def test_a_scoped_token_pushing_another_clusters_node_id_neither_moves_it_nor_reads_it() -> None:
    """A token of cluster A may push any node id within A, B's included: that is A's node of
    that name, a node of its own, so B's node keeps its group and open episode and nothing of
    B reaches A's reply or A's reads."""
    recv, state, _, _ = receiver()
    ops = Identity("ops", "ba9876543210", None)
    rack = Identity("rack-a", "0123456789ab", RACK_A)

    def push_b() -> None:
        for i in range(8):
            node = NodePush(node_id=f"b{i}", cluster_id="B", score=0.2 if i == 3 else 0.9)
            assert recv.request("metrics", encode_health(node, 1), ops).accepted == 1

    opened: list[Event] = []
    for _ in range(10):  # the default enter rule takes a few ticks below the threshold
        if opened:
            break
        push_b()
        opened = [e for e in state.tick().events if e.type == "straggler_state"]
    (started,) = opened
    assert (started.cluster_id, started.node_id) == ("B", "b3")
    reply = recv.request("metrics", encode_health(push("b3", "A"), 1), rack)
    assert reply.accepted == 1 and reply.view is not None
    assert reply.view.episode_id is None and reply.view.cluster_id == "A"
    tick = state.tick()  # B's node is still B's straggler, in B's group, same episode
    assert [e.type for e in tick.events] == []
    assert [(v.cluster_id, v.node_id, v.event_id) for v in tick.verdicts] == [
        ("B", "b3", started.event_id)
    ]
    assert {g.group: g.active_nodes for g in tick.groups} == {
        "A/workload/unknown": 1,
        "B/workload/unknown": 8,
    }
    read = state.threshold_view("A", workload_type="unknown", node_id="b3")
    assert read is not None and read.episode_id is None
    read_b = state.threshold_view("B", workload_type="unknown", node_id="b3")
    assert read_b is not None and read_b.episode_id == started.event_id


def test_gate_audits_a_scope_refusal_by_token_and_reason(tmp_path: Path) -> None:
    """Through a real AuditLog to a datagram socket standing where journald's would."""
    journal = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    journal.bind(str(tmp_path / "journal"))
    journal.settimeout(5)
    audit = AuditLog("fleet", window=3600, writer=JournalWriter(str(tmp_path / "journal")))
    ring: Keyring[ClusterScope] = Keyring([NamedToken("rack-a", digest("t"), RACK_A)])
    gate = Gate(ring, None, RateLimitConfig(), audit)
    try:
        admitted = gate.admit("otlp-http", "Bearer t", "10.0.0.1", "no")
        assert isinstance(admitted, Identity)
        gate.deny("otlp-http", admitted, "10.0.0.1", CLUSTER_NOT_ALLOWED)
        gate.deny("otlp-http", Identity("", "", None), "10.0.0.1", CLUSTER_NOT_ALLOWED)  # off
        assert audit.flush() == 2  # the admission and the one refusal
        entries = [dict(journal_fields(journal.recv(65536))) for _ in range(2)]
    finally:
        audit.close()
        journal.close()
    refused = [e for e in entries if e["INGERO_OUTCOME"] == REFUSED]
    assert len(refused) == 1
    assert refused[0]["INGERO_REASON"] == CLUSTER_NOT_ALLOWED
    assert refused[0]["INGERO_TOKEN_NAME"] == "rack-a"
    assert refused[0]["INGERO_TOKEN_ID"] == admitted.token_id
    assert refused[0]["INGERO_SOURCE"] == "10.0.0.1"
    assert refused[0]["MESSAGE_ID"] == AUDIT_MESSAGE_ID


def journal_fields(datagram: bytes) -> list[tuple[str, str]]:
    """journald's native protocol, the simple form the writer uses for short values."""
    return [
        (key, value)
        for key, _, value in (line.partition("=") for line in datagram.decode().splitlines())
    ]
