"""Fleet's security surface against the real daemon: token and certificate rotation on
SIGHUP under continuous pushes, rate limits answered 429/RESOURCE_EXHAUSTED and honoured by
fleet-push's client, and the warning for an open listener."""

from __future__ import annotations

import os
import random
import signal
import ssl
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)

from ingero.otlp.health import NodePush
from ingero.push.agent import Agent
from ingero.push.agent import Identity as AgentIdentity
from ingero.push.client import make_client
from ingero.push.config import PushConfig
from ingero.runtime.clock import ManualClock
from tests.integration.fleet.helpers import Fleet, health_request, start_fleet, wait_for
from tests.integration.security import BackToBack, RotationCerts, replace
from tests.unit.push.test_agent import Sampler


def pusher(config: PushConfig, node: str) -> BackToBack:
    """fleet-push's own client (HTTP or gRPC), pushing back to back."""
    client = make_client(config)

    def send(i: int) -> str | None:
        push = NodePush(node_id=node, cluster_id="c", score=0.9 - (i % 3) * 0.01)
        result = client.push(health_request([push]))
        return None if result.ok else str(result.error)

    return BackToBack(send)


def token_fleet(tmp: Path, token: str, rate_limit: dict[str, float]) -> Fleet:
    """A Fleet whose one token is ``token``, with ``rate_limit`` over the defaults."""
    token_file = tmp / "token"
    token_file.write_text(token + "\n")
    auth = {"token_file": str(token_file), "rate_limit": rate_limit}
    fleet = start_fleet(tmp, {"auth": auth})
    fleet.token = token
    return fleet


def hup(fleet: Fleet) -> None:
    assert fleet.proc is not None
    fleet.proc.send_signal(signal.SIGHUP)


def log_count(fleet: Fleet, text: str) -> Callable[[], int]:
    assert fleet.log_path is not None
    path = fleet.log_path
    return lambda: path.read_text().count(text)


def test_rotating_tokens_and_certificate_under_load_fails_no_push(tmp_path: Path) -> None:
    certs = RotationCerts(tmp_path)
    ca, cert, key = certs.ca, certs.cert, certs.key
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    old, new = "old-token-0123456789", "new-token-9876543210"
    (tokens / "node-old").write_text(old + "\n")
    node_token = tmp_path / "node-token"
    node_token.write_text(old + "\n")
    grace = 2.0
    fleet = start_fleet(
        tmp_path,
        {
            "auth": {
                "token_dir": str(tokens),
                "token_grace": f"{grace}s",
                "tls_cert": str(cert),
                "tls_key": str(key),
            }
        },
        ssl_context=ssl.create_default_context(cafile=str(ca)),
    )
    reloaded = log_count(fleet, "reloaded the TLS certificate")
    port = fleet.otlp_http.rpartition(":")[2]
    gport = fleet.otlp_grpc.rpartition(":")[2]
    pushers = [
        pusher(
            PushConfig(
                fleet_endpoint=f"https://localhost:{port}",
                auth_token_file=str(node_token),
                ca_file=str(ca),
                push_interval=10.0,
            ),
            "http-node",
        ),
        pusher(
            PushConfig(
                fleet_endpoint=f"localhost:{gport}",
                transport="grpc",
                auth_token_file=str(node_token),
                ca_file=str(ca),
                push_interval=10.0,
            ),
            "grpc-node",
        ),
    ]
    try:
        assert certs.served(fleet.otlp_http) == certs.a[0]
        for p in pushers:
            p.start()
        wait_for(lambda: all(p.ok > 20 for p in pushers), what="pushes before the rotation")
        # 1. Fleet learns the new token (both valid now), then the node switches to it.
        (tokens / "node-new").write_text(new + "\n")
        hup(fleet)
        wait_for(lambda: reloaded() >= 1, what="the first reload")
        replace(node_token, (new + "\n").encode())
        # 2. The old token is removed and the certificate replaced, in one reload.
        (tokens / "node-old").unlink()
        certs.use(certs.b)
        hup(fleet)
        wait_for(lambda: reloaded() >= 2, what="the second reload")
        assert certs.served(fleet.otlp_http) == certs.b[0]
        assert certs.served(fleet.api) == certs.b[0]
        # 3. A reload that fails (a certificate that is not one) keeps the old material.
        replace(cert, b"not a certificate\n")
        hup(fleet)
        wait_for(log_count(fleet, "TLS reload failed"), what="the failed reload's line")
        # The grace window ends: the old token is refused; the nodes, on the new one, go on.
        fleet.token = old
        wait_for(
            lambda: fleet.push([NodePush(node_id="x", cluster_id="c", score=0.9)]).status == 401,
            timeout=grace + 30,
            what="the old token refused",
        )
        marks = [p.ok for p in pushers]
        wait_for(
            lambda: all(p.ok > m + 20 for p, m in zip(pushers, marks, strict=True)),
            what="pushes after the rotation",
        )
    finally:
        for p in pushers:
            p.stop()
    try:
        assert [p.failures for p in pushers] == [[], []]
        assert certs.served(fleet.otlp_http) == certs.b[0]
        # A new gRPC connection is served the new certificate too: trusting only its CA works.
        creds = grpc.ssl_channel_credentials(certs.ca_b.read_bytes())
        with grpc.secure_channel(f"localhost:{gport}", creds) as channel:
            export = channel.unary_unary(
                "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=ExportMetricsServiceResponse.FromString,
            )
            push = health_request([NodePush(node_id="g2", cluster_id="c", score=0.9)])
            export(push, timeout=10, metadata=(("authorization", f"Bearer {new}"),))
        fleet.token = new
        assert fleet.push([NodePush(node_id="x", cluster_id="c", score=0.9)]).status == 200
    finally:
        fleet.stop()


def test_token_over_its_rate_gets_429_and_fleet_push_waits_as_told(tmp_path: Path) -> None:
    fleet = token_fleet(tmp_path, "rate-token-0123456789", {"per_token": 0.5, "token_burst": 3})
    token_file = tmp_path / "token"
    try:
        push = [NodePush(node_id="n", cluster_id="c", score=0.9)]
        statuses = [fleet.push(push) for _ in range(4)]
        assert [r.status for r in statuses] == [200, 200, 200, 429]
        assert statuses[3].headers["retry-after"] == "2"  # 1 token at 0.5/s
        # fleet-push's clients read the wait: HTTP Retry-After, gRPC RetryInfo.
        config = PushConfig(
            fleet_endpoint=f"http://{fleet.otlp_http}", auth_token_file=str(token_file)
        )
        result = make_client(config).push(health_request(push))
        assert not result.ok and result.retry_after == 2.0
        grpc_config = PushConfig(
            fleet_endpoint=fleet.otlp_grpc, transport="grpc", auth_token_file=str(token_file)
        )
        result = make_client(grpc_config).push(health_request(push))
        assert not result.ok and result.retry_after is not None
        assert 0.5 < result.retry_after <= 2.0
        assert "RESOURCE_EXHAUSTED" in str(result.error)
        # /metrics takes the same token, so it waits for the bucket to refill too
        metrics = wait_for(
            lambda: (r := fleet.request(fleet.api, "GET", "/metrics")).status == 200 and r.body,
            what="/metrics once the bucket refilled",
        )
        assert b'ingero_fleet_rejected_total{reason="rate_limited"}' in metrics
    finally:
        fleet.stop()


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_the_push_agent_waits_as_long_as_fleet_asks(tmp_path: Path, transport: str) -> None:
    """fleet-push's agent (its real client; a stand-in sampler, as no GPU runs here) against
    the real Fleet: over the token's rate, the next push waits Fleet's Retry-After/RetryInfo
    (10 s at 0.1/s), not the 1 s push interval."""
    fleet = token_fleet(tmp_path, "agent-token-0123456789", {"per_token": 0.1, "token_burst": 1})
    try:
        endpoint = f"http://{fleet.otlp_http}" if transport == "http" else fleet.otlp_grpc
        config = PushConfig(
            fleet_endpoint=endpoint,
            transport=transport,  # type: ignore[arg-type]
            auth_token_file=str(tmp_path / "token"),
            push_interval=1.0,
        )
        clock = ManualClock()
        agent = Agent(
            config,
            AgentIdentity("n1", "c1", job_id="42", rank=1),
            Sampler(clock),
            make_client(config),
            [],
            clock,
            None,
            random.Random(0),
        )
        assert agent.step() <= 1.1  # accepted: the push interval, jittered
        assert 9.0 < agent.step() <= 10.0  # refused 429: Fleet's wait
    finally:
        fleet.stop()


def test_refusals_from_one_address_are_limited(tmp_path: Path) -> None:
    fleet = token_fleet(
        tmp_path, "good-token-0123456789", {"refusals_per_source": 0.2, "refusal_burst": 2}
    )
    try:
        fleet.token = "guess"
        push = [NodePush(node_id="n", cluster_id="c", score=0.9)]
        assert [fleet.push(push).status for _ in range(3)] == [401, 401, 429]
        fleet.token = "good-token-0123456789"  # a valid token is not held back
        assert fleet.push(push).status == 200
    finally:
        fleet.stop()


def test_open_listener_without_a_token_warns_once(tmp_path: Path) -> None:
    fleet = start_fleet(tmp_path, {"listen": {"otlp_http": "0.0.0.0:0"}})
    try:
        assert fleet.log_path is not None
        lines = [
            line
            for line in fleet.log_path.read_text().splitlines()
            if "no bearer token configured" in line
        ]
        assert len(lines) == 1 and "otlp_http 0.0.0.0:" in lines[0]
        assert "otlp_grpc" not in lines[0]  # loopback listeners are not named
    finally:
        fleet.stop()
    token_file = tmp_path / "token"
    token_file.write_text("some-token-0123456789\n")
    os.makedirs(tmp_path / "b")
    fleet = start_fleet(
        tmp_path / "b",
        {"listen": {"otlp_http": "0.0.0.0:0"}, "auth": {"token_file": str(token_file)}},
    )
    try:
        assert fleet.log_path is not None
        assert "no bearer token configured" not in fleet.log_path.read_text()
    finally:
        fleet.stop()
