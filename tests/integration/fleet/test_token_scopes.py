"""Fleet tokens scoped to clusters (auth.token_clusters) against the real daemon, over
OTLP/HTTP and OTLP/gRPC: a rack's token pushes for its own cluster only, a refused request
leaves the other cluster's threshold as it was, the refusals are counted on /metrics, and a
scope changed in the configuration file takes effect on SIGHUP, without a restart."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)

from ingero.otlp.health import NodePush
from ingero.otlp.logs import encode_events
from ingero.push.client import make_client
from ingero.push.config import PushConfig
from ingero.schema.events import Event
from tests.integration.fleet.helpers import (
    Fleet,
    Reply,
    expected_threshold,
    health_request,
    start_fleet,
    wait_for,
)
from tests.integration.push.cluster import Cluster, Procs

pytestmark = pytest.mark.integration

RACK_A = "rack-a-token-0123456789"
OPS = "ops-token-9876543210"
B_SCORES = [0.90, 0.91, 0.92, 0.93, 0.94, 0.95]
METRICS_EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
LOGS_EXPORT = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"


def b_nodes(scores: Iterable[float], prefix: str = "b") -> list[NodePush]:
    return [NodePush(node_id=f"{prefix}{i}", cluster_id="B", score=s) for i, s in enumerate(scores)]


def as_token(fleet: Fleet, token: str) -> Fleet:
    fleet.token = token
    return fleet


def grpc_export(fleet: Fleet, token: str, method: str, request: Message) -> grpc.StatusCode:
    """One Export call with a real gRPC client; the status code it ended with."""
    response = (
        ExportMetricsServiceResponse if method == METRICS_EXPORT else ExportLogsServiceResponse
    )
    with grpc.insecure_channel(fleet.otlp_grpc) as channel:
        export: Callable[..., Any] = channel.unary_unary(
            method,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response.FromString,
        )
        try:
            export(request, timeout=10, metadata=(("authorization", f"Bearer {token}"),))
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.PERMISSION_DENIED, exc
            assert exc.details() == "token rack-a may not push for cluster B"
            return grpc.StatusCode.PERMISSION_DENIED
    return grpc.StatusCode.OK


# Fleet-wide series: read with the unscoped token (a scoped one's /metrics has only its
# clusters' series), whichever token the test is pushing with.
def ticks(fleet: Fleet) -> float:
    return replace(fleet, token=OPS).metric("ingero_fleet_tick_seconds_count")


def refused(fleet: Fleet) -> float:
    return replace(fleet, token=OPS).metric(
        "ingero_fleet_rejected_total", reason="cluster_not_allowed"
    )


def test_a_scoped_token_pushes_for_its_clusters_only(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    (tokens / "rack-a").write_text(RACK_A + "\n")
    (tokens / "ops").write_text(OPS + "\n")
    fleet = start_fleet(
        tmp_path, {"auth": {"token_dir": str(tokens), "token_clusters": {"rack-a": ["A"]}}}
    )
    try:
        # ops (unscoped) makes cluster B's group and its threshold
        assert as_token(fleet, OPS).push(b_nodes(B_SCORES)).status == 200
        wait_for(lambda: fleet.threshold("B").status == 200, what="B's first threshold")
        before = fleet.threshold("B").json()
        assert before["threshold"] == pytest.approx(expected_threshold(B_SCORES))
        assert before["active_nodes"] == len(B_SCORES)

        # rack-a for its own cluster: accepted, on both transports
        a = [NodePush(node_id="a0", cluster_id="A", score=0.9)]
        assert as_token(fleet, RACK_A).push(a).status == 200
        assert grpc_export(fleet, RACK_A, METRICS_EXPORT, health_request(a)) == grpc.StatusCode.OK

        # rack-a for B, low scores that would drag B's threshold down: refused whole, even
        # mixed with a resource of A; metrics and logs, HTTP and gRPC
        low = b_nodes([0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1], prefix="liar")
        reply = as_token(fleet, RACK_A).push([*a, *low], encoding="json")
        assert reply.status == 403
        assert reply.json()["message"] == "token rack-a may not push for cluster B"
        event = Event(type="straggler_state", node_id="b0", cluster_id="B", timestamp=1.0)
        assert fleet.post_logs([event]).status == 403
        denied = grpc.StatusCode.PERMISSION_DENIED
        assert grpc_export(fleet, RACK_A, METRICS_EXPORT, health_request(low)) == denied
        assert grpc_export(fleet, RACK_A, LOGS_EXPORT, encode_events([event])) == denied
        assert refused(fleet) == 4
        # fleet-push's own clients: one clear line, and no wait asked (a 403 is final:
        # its exporters do not retry it, ingero.otlp.exporter)
        for transport, endpoint in (
            ("http", f"http://{fleet.otlp_http}"),
            ("grpc", fleet.otlp_grpc),
        ):
            config = PushConfig(
                fleet_endpoint=endpoint,
                transport=transport,  # type: ignore[arg-type]
                auth_token_file=str(tokens / "rack-a"),
                cluster_id="B",
            )
            result = make_client(config).push(health_request(low))
            assert not result.ok and result.retry_after is None
            assert result.error is not None and "\n" not in result.error
            assert result.error.endswith("token rack-a may not push for cluster B"), result.error
        assert refused(fleet) == 6

        # B's threshold is ops's alone, ticks later
        mark = ticks(fleet)
        wait_for(lambda: ticks(fleet) >= mark + 2, what="two ticks")
        after = as_token(fleet, OPS).threshold("B").json()
        assert after["threshold"] == pytest.approx(before["threshold"])
        assert after["active_nodes"] == len(B_SCORES)
        # ops may push for B (and any cluster)
        assert as_token(fleet, OPS).push(b_nodes(B_SCORES)).status == 200

        # The scope changed in the configuration file, then SIGHUP: no restart
        config_path = tmp_path / "fleet.yaml"
        config = yaml.safe_load(config_path.read_text())
        config["auth"]["token_clusters"] = {"rack-a": ["A", "B"], "ops": ["C"]}
        config_path.write_text(yaml.safe_dump(config))
        assert fleet.proc is not None
        fleet.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "reloaded 2 token(s)" in fleet.log(), what="the reload")
        assert as_token(fleet, RACK_A).push(b_nodes(B_SCORES)).status == 200
        assert grpc_export(fleet, RACK_A, METRICS_EXPORT, health_request(low)) == grpc.StatusCode.OK
        reply = as_token(fleet, OPS).push(b_nodes(B_SCORES), encoding="json")
        assert reply.status == 403
        assert reply.json()["message"] == "token ops may not push for cluster B"

        # A scope for a token that does not exist: the reload fails, the scopes stay
        config["auth"]["token_clusters"] = {"rack-b": ["B"]}
        config_path.write_text(yaml.safe_dump(config))
        fleet.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "no token is named 'rack-b'" in fleet.log(), what="the failed reload")
        assert as_token(fleet, OPS).push(b_nodes(B_SCORES)).status == 403
        assert fleet.proc.poll() is None  # the same process all along
        assert "Traceback" not in fleet.log()
    finally:
        fleet.stop()


def test_a_scope_for_no_such_token_stops_fleet_at_start(tmp_path: Path) -> None:
    (tmp_path / "ops").write_text(OPS + "\n")
    with pytest.raises(
        AssertionError, match=r"exited 78: ingero: auth.token_clusters: no token is named 'rack-a'"
    ):
        start_fleet(
            tmp_path,
            {
                "auth": {
                    "token_files": [str(tmp_path / "ops")],
                    "token_clusters": {"rack-a": ["A"]},
                }
            },
        )


SAME_JOB = "4242"


def test_two_clusters_node_of_the_same_name_stay_apart(tmp_path: Path) -> None:
    """Clusters A and B both name a node gpu01 (as Slurm sites do), each pushed by a real
    fleet-push with its cluster's token; B's gpu01 runs slow. Neither group ever counts the
    other's gpu01, B's episode stays open under one id, and nothing A's token gets (a read
    naming gpu01, a push reply as gpu01) carries B's episode id."""
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    for name, token in (("rack-a", RACK_A), ("rack-b", RACK_A[::-1]), ("ops", OPS)):
        (tokens / name).write_text(token + "\n")
    auth = {"token_dir": str(tokens), "token_clusters": {"rack-a": ["A"], "rack-b": ["B"]}}
    procs = Procs()

    def cluster(name: str, token: str) -> Cluster:
        (tmp_path / name).mkdir()
        return Cluster(
            tmp_path / name,
            procs,
            0.5,
            2,
            job_id=SAME_JOB,
            cluster_id=name.upper(),
            node_prefix="gpu",
            token_file=tokens / token,
            fleet_config={"auth": auth, "ttl_multiplier": 1000},
        )

    a, b = cluster("a", "rack-a"), cluster("b", "rack-b")
    try:
        a.start_fleet()
        b.ports = a.ports
        b.start_sink()
        for c in (a, b):
            c.start_workload(1)
            c.start_push(1)
        fleet = Fleet(
            a.fleet, "", f"127.0.0.1:{a.ports['otlp_http']}", f"127.0.0.1:{a.ports['api']}"
        )
        # B's peers, as fast as the healthy nodes are: B's group has quorum, its gpu01 lags
        peers = [
            NodePush(node_id=f"b-peer{i}", cluster_id="B", job_id=SAME_JOB, score=1.0)
            for i in range(4)
        ]
        assert as_token(fleet, OPS).push(peers).status == 200
        wait_for(lambda: "fleet" in b.modes("gpu01"), 90, what="B's gpu01 in fleet mode")
        b.slow_down(1, 0.6)

        def b_episode() -> str | None:
            view = as_token(fleet, OPS).threshold("B", SAME_JOB, node_id="gpu01")
            return view.json()["episode_id"] if view.status == 200 else None

        offered = wait_for(b_episode, 120, what="B's gpu01 straggler episode")
        # Fleet's id is only offered until gpu01's next push, which may bring the node's own
        mark = ticks(fleet)
        wait_for(lambda: ticks(fleet) >= mark + 2, what="two ticks")
        episode = b_episode()
        assert episode is not None
        ids = {offered.encode(), episode.encode()}

        def carries_b(reply: Reply) -> bool:
            text = reply.body + repr(reply.headers).encode()
            return "x-ingero-episode-id" in reply.headers or any(i in text for i in ids)

        mark = ticks(fleet)
        rounds = 0
        while ticks(fleet) < mark + 10:  # ten ticks of both gpu01s pushing
            rounds += 1
            ops = as_token(fleet, OPS)
            assert ops.threshold("B", SAME_JOB).json()["active_nodes"] == 5
            assert ops.threshold("A", SAME_JOB).json()["active_nodes"] == 1
            assert b_episode() == episode
            mine = as_token(fleet, RACK_A)
            read = mine.threshold("A", SAME_JOB, node_id="gpu01")
            assert read.status == 200 and not carries_b(read)
            # A's token pushing as gpu01 (A's own node of that name): its reply has none of B
            gpu01 = NodePush(node_id="gpu01", cluster_id="A", job_id=SAME_JOB, score=0.9)
            reply = mine.push([gpu01])
            assert reply.status == 200 and not carries_b(reply)
        assert rounds > 1
        assert b_episode() == episode
        assert "Traceback" not in (tmp_path / "a" / "fleet.log").read_text()
    finally:
        procs.stop_all()
