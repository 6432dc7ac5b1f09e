"""What HAProxy adds to a push: latency through the balancer vs. straight to one Fleet.

Run: ``.venv/bin/python -m bench.haproxy`` (``--pushes 500`` to shorten).

Three ``ingero fleet`` replicas behind a real HAProxy configured from
``contrib/haproxy/haproxy.cfg.j2`` (consistent hashing on the cluster id), all on loopback.
One client pushes with fleet-push's own clients (HTTP: a new connection per push, as
fleet-push does; gRPC: one channel), alternating each push between the balancer and the
replica that owns the cluster, so both paths see the same load and the same moment. Each
push is one node's health (64 nodes per cluster, ``--clusters`` clusters). Printed: p50,
p99 and mean per path and transport, and the added p50/p99.
"""

from __future__ import annotations

import argparse
import socket
import tempfile
import time
from pathlib import Path

import numpy as np

from ingero.otlp.health import NodePush, encode_health
from ingero.push.client import GrpcPushClient, HttpPushClient, PushClient
from ingero.push.config import PushConfig
from tests.integration.fleet.haproxy import Haproxy, missing_reason, start_haproxy
from tests.integration.fleet.helpers import Fleet, start_fleet, wait_for


def free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def client(transport: str, endpoint: str, cluster: str) -> PushClient:
    config = PushConfig(
        fleet_endpoint=endpoint,
        transport=transport,  # type: ignore[arg-type]
        cluster_id=cluster,
        timeout=2.0,  # type: ignore[arg-type]
    )
    return HttpPushClient(config) if transport == "http" else GrpcPushClient(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pushes", type=int, default=3000, help="per path and transport")
    parser.add_argument("--clusters", type=int, default=12)
    args = parser.parse_args()
    reason = missing_reason()
    if reason:
        raise SystemExit(reason)
    root = Path(tempfile.mkdtemp(prefix="ingero-bench-haproxy-"))
    ports = free_ports(12)
    fleets: list[Fleet] = []
    balancer = None
    try:
        for i in range(3):
            listen = dict(
                zip(("otlp_http", "otlp_grpc", "api"), ports[3 * i : 3 * i + 3], strict=True)
            )
            (root / f"fleet{i + 1}").mkdir()
            fleets.append(
                start_fleet(
                    root / f"fleet{i + 1}",
                    {
                        "listen": {k: f"127.0.0.1:{v}" for k, v in listen.items()},
                        "push_interval": "1s",
                        "ttl_multiplier": 1000,
                    },
                )
            )
        names = ("otlp_http", "otlp_grpc", "api")
        servers = [
            {
                "name": f"fleet{i + 1}",
                "host": "127.0.0.1",
                **dict(zip(names, ports[3 * i : 3 * i + 3], strict=True)),
            }
            for i in range(3)
        ]
        balancer = start_haproxy(root, servers, ports[9:12])
        clusters = [f"bench{i:02d}" for i in range(args.clusters)]
        now = time.time_ns()
        rows = []
        for transport in ("http", "grpc"):
            via = {c: client(transport, address(balancer, transport), c) for c in clusters}
            # where each cluster landed: the replica that holds its group after a tick
            for c in clusters:
                via[c].push(encode_health(NodePush(f"{c}-n0", c, 0.9, job_id="1"), now))
            home = {
                c: wait_for(lambda c=c: owner(fleets, c), 10, f"cluster {c} on a replica")
                for c in clusters
            }
            direct = {c: client(transport, address(home[c], transport), c) for c in clusters}
            lat: dict[str, list[float]] = {"haproxy": [], "direct": []}
            for k in range(args.pushes):
                c = clusters[k % len(clusters)]
                request = encode_health(NodePush(f"{c}-n{k % 64}", c, 0.9, job_id="1"), now)
                order = (("haproxy", via), ("direct", direct))
                for path, clients in order if k % 2 else order[::-1]:
                    start = time.perf_counter()
                    result = clients[c].push(request)
                    lat[path].append(time.perf_counter() - start)
                    if not result.ok:
                        raise SystemExit(f"{path} {transport} push failed: {result.error}")
            for path, values in lat.items():
                ms = np.array(values) * 1000
                rows.append(
                    (transport, path, np.percentile(ms, 50), np.percentile(ms, 99), ms.mean())
                )
            for c in clusters:
                via[c].close()
                direct[c].close()
        print(f"{args.pushes} pushes per path, {args.clusters} clusters, 3 replicas, loopback")
        print(f"{'transport':<10}{'path':<9}{'p50 ms':>9}{'p99 ms':>9}{'mean ms':>9}")
        for transport, path, p50, p99, mean in rows:
            print(f"{transport:<10}{path:<9}{p50:>9.3f}{p99:>9.3f}{mean:>9.3f}")
        for transport in ("http", "grpc"):
            h = next(r for r in rows if r[0] == transport and r[1] == "haproxy")
            d = next(r for r in rows if r[0] == transport and r[1] == "direct")
            print(f"{transport}: HAProxy adds p50 {h[2] - d[2]:+.3f} ms, p99 {h[3] - d[3]:+.3f} ms")
    finally:
        if balancer is not None:
            balancer.stop()
        for f in fleets:
            f.stop()


def address(target: Fleet | Haproxy, transport: str) -> str:
    return f"http://{target.otlp_http}" if transport == "http" else target.otlp_grpc


def owner(fleets: list[Fleet], cluster: str) -> Fleet | None:
    found = [f for f in fleets if f.threshold(cluster, "1").status == 200]
    return found[0] if len(found) == 1 else None


if __name__ == "__main__":
    main()
