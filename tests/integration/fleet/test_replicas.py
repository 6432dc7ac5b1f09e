"""Three real ``ingero fleet`` replicas behind a real HAProxy (contrib/haproxy's template),
a real ``ingero echo``, a real Slurm cluster for the drain controller (dry run), and a
population of nodes pushing through the balancer with fleet-push's own client.

Time is counted in push rounds (one push of every node, then one push interval), never
asserted in seconds. Without a balancer, fleet-push's own failover is the second test.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ingero.otlp.health import NodePush
from ingero.otlp.logs import encode_events
from ingero.push.client import GrpcPushClient, HttpPushClient, PushClient, PushResult
from ingero.push.config import PushConfig
from ingero.schema.events import Event
from tests.integration.echo.helpers import TOKEN_OPS, EchoProcess
from tests.integration.fleet import haproxy as hap
from tests.integration.fleet.helpers import Fleet, health_request, start_fleet, wait_for
from tests.integration.slurm import cluster as slurm

pytestmark = pytest.mark.integration

INTERVAL = 1.0  # seconds: Fleet's push_interval and the pushers' round
MIN_INTERVALS = 3  # drain.min_intervals
CLUSTERS = [f"c{i:02d}" for i in range(12)]
JOBS = ("j1", "j2")
PER_JOB = 4  # 12 clusters x 2 jobs x 4 nodes = 96 nodes
SLURM_CLUSTER = "c00"  # the one cluster with a (real) Slurm behind it; its nodes n1..n8


def node_names(cluster: str, job: int) -> list[str]:
    first = job * PER_JOB + 1
    if cluster == SLURM_CLUSTER:
        return [f"n{i}" for i in range(first, first + PER_JOB)]
    return [f"{cluster}-n{i}" for i in range(first, first + PER_JOB)]


@dataclass
class Replica:
    name: str
    workdir: Path
    ports: dict[str, int]
    config: dict[str, Any]
    env: dict[str, str]
    fleet: Fleet | None = None
    logs: list[Path] = field(default_factory=list)

    def start(self) -> None:
        (self.workdir / "ready.json").unlink(missing_ok=True)
        self.fleet = start_fleet(self.workdir, self.config, self.env)
        assert self.fleet.log_path is not None
        self.logs.append(self.fleet.log_path)

    def kill(self) -> None:
        assert self.fleet is not None and self.fleet.proc is not None
        self.fleet.proc.send_signal(signal.SIGKILL)
        self.fleet.proc.wait()
        # the next start writes a new log: keep this one
        assert self.fleet.log_path is not None
        kept = self.workdir / f"fleet.{len(self.logs)}.log"
        self.fleet.log_path.rename(kept)
        self.logs[-1] = kept

    def stop(self) -> None:
        if (
            self.fleet is not None
            and self.fleet.proc is not None
            and self.fleet.proc.poll() is None
        ):
            self.fleet.stop()

    def log(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.logs if p.exists())

    def has(self, cluster: str, job: str) -> bool:
        """Whether this replica holds a threshold for the group (it got its pushes)."""
        if self.fleet is None or self.fleet.proc is None or self.fleet.proc.poll() is not None:
            return False
        return self.fleet.threshold(cluster, job).status == 200

    def would_drain(self, node: str) -> int:
        return len(re.findall(rf"not draining {node}: dry run: would drain", self.log()))


class Population:
    """Every cluster's nodes, one fleet-push client per cluster (it sends the cluster id
    header), one request per job per round; one event per cluster per round, resent until
    a receiver takes it (as fleet-push's OTLP events channel does)."""

    def __init__(self, endpoint: str) -> None:
        self.clients: dict[str, PushClient] = {
            c: HttpPushClient(
                PushConfig(fleet_endpoint=endpoint, cluster_id=c, push_interval=INTERVAL)  # type: ignore[arg-type]
            )
            for c in CLUSTERS
        }
        self.low: set[str] = {"n1"}  # stragglers
        self.sent: set[str] = set()
        self.unsent: list[Event] = []
        self.round = 0
        self.next_at = time.monotonic()

    def push_round(self) -> dict[tuple[str, str], PushResult]:
        wait = self.next_at - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        self.next_at = max(self.next_at + INTERVAL, time.monotonic())
        self.round += 1
        results = {}
        for cluster, client in self.clients.items():
            for j, job in enumerate(JOBS):
                pushes = [
                    NodePush(
                        node_id=node,
                        cluster_id=cluster,
                        score=0.3 if node in self.low else 0.9 + 0.01 * (i % 3),
                        state="active",
                        job_id=job,
                    )
                    for i, node in enumerate(node_names(cluster, j))
                ]
                results[(cluster, job)] = client.push(health_request(pushes))
            self.unsent.append(
                Event(
                    "straggler_state",
                    node_names(cluster, 0)[1],
                    cluster,
                    time.time(),
                    job_id="j1",
                    score=0.5,
                    threshold=0.8,
                )
            )
        left = []
        for event in self.unsent:
            try:
                self.clients[event.cluster_id].export_logs(encode_events([event]))
                self.sent.add(event.event_id)
            except Exception:
                left.append(event)
        self.unsent = left
        return results

    def close(self) -> None:
        for client in self.clients.values():
            client.close()


def echo_events(db: Path) -> list[tuple[str, str]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return [(str(r[0]), str(r[1])) for r in conn.execute("SELECT event_id, type FROM events")]
    finally:
        conn.close()


def owners(replicas: list[Replica]) -> dict[tuple[str, str], list[str]]:
    return {(c, j): [r.name for r in replicas if r.has(c, j)] for c in CLUSTERS for j in JOBS}


def rounds_until(pop: Population, done: Any, limit: int, what: str) -> int:
    for n in range(1, limit + 1):
        pop.push_round()
        if done():
            return n
    raise AssertionError(f"{what}: not after {limit} rounds")


def _due(
    first: int, heir: str, before: list[dict[str, float]], after: list[dict[str, float]]
) -> int | None:
    """The first round that began once ``heir`` had ticked twice since round ``first``."""
    for i in range(first + 1, len(before)):
        if before[i][heir] >= after[first][heir] + 2:
            return i
    return None


def _all_due(
    replies: list[dict[tuple[str, str], tuple[bool, bool]]],
    before: list[dict[str, float]],
    after: list[dict[str, float]],
    placed: dict[tuple[str, str], list[str]],
) -> bool:
    """Whether every moved group has been pushed in the round its threshold is due."""
    for key in replies[0]:
        rounds = [i for i, seen in enumerate(replies) if seen[key][0]]
        if not rounds or len(placed[key]) != 1:
            return False
        if _due(rounds[0], placed[key][0], before, after) is None:
            return False
    return True


@pytest.fixture
def setup() -> Iterator[tuple[list[Replica], hap.Haproxy, EchoProcess, Population]]:
    reason = hap.missing_reason() or slurm.missing_reason()
    if reason:
        pytest.skip(reason)
    # Not pytest's tmp_path: its parents are 0700 and munged runs as the munge user.
    root = Path(tempfile.mkdtemp(prefix="ingero-replicas-"))
    root.chmod(0o755)
    with ExitStack() as stack:
        if not os.environ.get("INGERO_KEEP_TMP"):  # the logs, for a failure
            stack.callback(shutil.rmtree, root, ignore_errors=True)
        cluster = stack.enter_context(
            slurm.slurm_cluster(root / "slurm", nodes=2 * PER_JOB, cluster_name=SLURM_CLUSTER)
        )
        (root / "echo").mkdir()
        echo = EchoProcess(root / "echo").start()
        stack.callback(echo.stop)
        ports = slurm.free_ports(12)
        replicas = []
        for i in range(3):
            p = dict(zip(("otlp_http", "otlp_grpc", "api"), ports[3 * i : 3 * i + 3], strict=True))
            workdir = root / f"fleet{i + 1}"
            workdir.mkdir()
            config = {
                "listen": {k: f"127.0.0.1:{v}" for k, v in p.items()},
                "push_interval": f"{INTERVAL}s",
                "ttl_multiplier": 5,
                "quorum": {"statistical_min": 3},
                "drain": {
                    "enabled": True,
                    "dry_run": True,
                    "backend": "scontrol",
                    "min_intervals": MIN_INTERVALS,
                    "max_fraction": 0.5,
                },
                "echo": {"endpoint": f"http://{echo.otlp_http}"},
            }
            env = {**cluster.env, "INGERO_ECHO_TOKEN": TOKEN_OPS}
            replica = Replica(f"fleet{i + 1}", workdir, p, config, env)
            replica.start()
            stack.callback(replica.stop)
            replicas.append(replica)
        servers = [{"name": r.name, "host": "127.0.0.1", **r.ports} for r in replicas]
        balancer = hap.start_haproxy(root, servers, ports[9:12])
        stack.callback(balancer.stop)
        pop = Population(f"http://{balancer.otlp_http}")
        stack.callback(pop.close)
        yield replicas, balancer, echo, pop


def test_replicas_behind_haproxy_failover_and_drain_ownership(
    setup: tuple[list[Replica], hap.Haproxy, EchoProcess, Population],
) -> None:
    replicas, balancer, echo, pop = setup
    by_name = {r.name: r for r in replicas}
    # Warm up until every group has a threshold with quorum in its push answers.
    rounds_until(
        pop,
        lambda: all(
            r.ok and r.reading is not None and r.reading.quorum_met
            for r in pop.push_round().values()
        ),
        10,
        "every group with a threshold",
    )
    # (a) every cluster (both of its jobs) on exactly one replica, every replica used
    placed = owners(replicas)
    assert all(len(names) == 1 for names in placed.values()), placed
    home = {c: placed[(c, "j1")][0] for c in CLUSTERS}
    assert all(placed[(c, "j2")] == [home[c]] for c in CLUSTERS), placed
    assert set(home.values()) == set(by_name), home
    victim = by_name[home[SLURM_CLUSTER]]
    rounds_until(pop, lambda: victim.would_drain("n1") == 1, 15, "the owner's drain of n1")
    # Nothing acked by the victim is still waiting in its forward queue when it dies.
    wait_for(lambda: {e for e, _ in echo_events(echo.db)} >= pop.sent, 30, "events in echo")

    # (b) SIGKILL the replica that owns the Slurm cluster
    moved = [c for c in CLUSTERS if home[c] == victim.name]
    victim.kill()
    survivors = [r for r in replicas if r is not victim]

    def ticks() -> dict[str, float]:
        """Each survivor's own tick count (its clock, not the test's rounds)."""
        return {r.name: r.fleet.metric("ingero_fleet_tick_seconds_count") for r in survivors}  # type: ignore[union-attr]

    # Per round: the survivors' tick counts before and after it, and per moved group
    # whether the push was answered (ok) and with a rebuilt threshold.
    before: list[dict[str, float]] = []
    after: list[dict[str, float]] = []
    replies: list[dict[tuple[str, str], tuple[bool, bool]]] = []
    drained_at: dict[str, int] = {}
    drained_ticks: dict[str, float] = {}  # read after the drain was seen in the log
    for n in range(1, 16):
        before.append(ticks())
        results = pop.push_round()
        after.append(ticks())
        replies.append({})
        for key, result in results.items():
            view = result.reading
            rebuilt = view is not None and view.quorum_met and view.threshold is not None
            if key[0] in moved:
                replies[-1][key] = (result.ok, rebuilt)
        for r in survivors:
            if r.would_drain("n1") and r.name not in drained_at:
                drained_at[r.name] = n
                drained_ticks[r.name] = ticks()[r.name]
        if n >= 5 and drained_at and _all_due(replies, before, after, owners(survivors)):
            break
    placed = owners(replicas)
    # Thresholds are rebuilt by the new owner's next tick: a push it answers once it has
    # ticked twice since it answered the group's first push (the first of those ticks may
    # have begun before that push arrived) carries the threshold. Ticks, not rounds: on a
    # loaded host a tick can come late within a round (docs/replicas.md).
    answered: dict[tuple[str, str], int] = {}
    for key in [(c, j) for c in moved for j in JOBS]:
        assert len(placed[key]) == 1, (key, placed[key])
        heir_name = placed[key][0]
        rounds = [i for i, seen in enumerate(replies) if seen[key][0]]
        assert rounds, (key, "never answered")
        first = rounds[0]
        due = _due(first, heir_name, before, after)
        assert due is not None, (key, "the heir never ticked twice", before, after)
        got = [i for i in rounds if replies[i][key][1]]
        assert got and got[0] <= due, (key, first, due, got)
        answered[key] = got[0] + 1
    assert len(answered) == 2 * len(moved), answered
    for c in CLUSTERS:
        names = placed[(c, "j1")]
        assert len(names) == 1, (c, names)
        if c not in moved:  # consistent hashing: only the dead replica's clusters move
            assert names == [home[c]], (c, names)
    heir = by_name[placed[(SLURM_CLUSTER, "j1")][0]]
    # only the heir drains n1 (dry run), and not within the takeover window
    assert list(drained_at) == [heir.name], drained_at
    # Not within the takeover window: the heir ticked at least min_intervals times from
    # the start of the round of its first push of the cluster to its drain.
    took = min(i for i, seen in enumerate(replies) if seen[(SLURM_CLUSTER, "j1")][0])
    assert drained_ticks[heir.name] - before[took][heir.name] >= MIN_INTERVALS, drained_at
    log = heir.log()
    assert log.index("took over cluster(s)") < log.index("not draining n1: dry run")

    # (c) restart it: its clusters come back (consistent hashing)
    victim.start()
    rounds_until(
        pop, lambda: all(victim.has(c, "j1") for c in moved), 15, "the clusters back on the victim"
    )
    # (e) a cluster that moves away from a live replica: n5 (job j2) starts straggling for
    # one round at its owner, then the owner is taken out of the balancer (maintenance); its stale
    # copy of n5 goes on straggling there, but only the new owner may drain it.
    pop.push_round()
    pop.low.add("n5")
    pop.push_round()
    balancer.set_state(victim.name, "maint")
    rounds_until(
        pop, lambda: sum(r.would_drain("n5") for r in replicas) >= 1, 15, "a dry-run drain of n5"
    )
    for _ in range(MIN_INTERVALS + 2):  # long enough for the stale copy to reach it too
        pop.push_round()
    drained_by = [r.name for r in replicas if r.would_drain("n5")]
    # the ring's next replica for the cluster (the heir again) drains it, the victim not
    assert drained_by == [heir.name], drained_by
    assert "not draining n5: this Fleet replica does not own" in victim.log()
    balancer.set_state(victim.name, "ready")
    pop.push_round()

    # (d) Echo holds every event once: none lost, none twice (its ids de-duplicate)
    assert not pop.unsent
    wait_for(lambda: {e for e, _ in echo_events(echo.db)} >= pop.sent, 30, "every event in echo")
    stored = echo_events(echo.db)
    assert len(stored) == len(set(stored)), "an event stored twice"


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_fleet_push_fails_over_between_endpoints_without_a_balancer(
    tmp_path: Path, transport: str
) -> None:
    fleets = []
    ports = slurm.free_ports(6)
    configs = [
        {
            "push_interval": "0.2s",
            "listen": {
                k: f"127.0.0.1:{ports[3 * i + j]}"
                for j, k in enumerate(("otlp_http", "otlp_grpc", "api"))
            },
        }
        for i in range(2)
    ]
    try:
        for name, cfg in zip(("a", "b"), configs, strict=True):
            (tmp_path / name).mkdir()
            fleets.append(start_fleet(tmp_path / name, cfg))
        endpoints = (
            [f"http://{f.otlp_http}" for f in fleets]
            if transport == "http"
            else [f.otlp_grpc for f in fleets]
        )
        config = PushConfig(
            fleet_endpoint=endpoints,
            transport=transport,  # type: ignore[arg-type]
            cluster_id="solo",
        )
        client: PushClient = (
            HttpPushClient(config) if transport == "http" else GrpcPushClient(config)
        )

        def push(node: str) -> PushResult:
            return client.push(
                health_request(
                    [
                        NodePush(
                            node_id=node, cluster_id="solo", score=0.9, state="active", job_id="j"
                        )
                    ]
                )
            )

        assert push("n1").ok
        wait_for(lambda: fleets[0].metric("ingero_fleet_tracked_nodes") == 1, 10, "n1 on the first")
        assert fleets[1].metric("ingero_fleet_tracked_nodes") == 0
        fleets[0].proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        fleets[0].proc.wait()  # type: ignore[union-attr]
        # the very next push goes on to the second endpoint, and so do the following ones
        for i in range(3):
            assert push(f"n{i + 2}").ok
        wait_for(
            lambda: fleets[1].metric("ingero_fleet_tracked_nodes") == 3,
            10,
            "three pushes on the second endpoint",
        )
        # the first one back: fleet-push stays where it works (sticky)
        (tmp_path / "a" / "ready.json").unlink()
        fleets[0] = start_fleet(tmp_path / "a", configs[0])
        assert push("n9").ok
        wait_for(
            lambda: fleets[1].metric("ingero_fleet_tracked_nodes") == 4, 10, "n9 on the second"
        )
        assert fleets[0].metric("ingero_fleet_tracked_nodes") == 0
        client.close()
    finally:
        for f in fleets:
            if f.proc is not None and f.proc.poll() is None:
                f.stop()


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_pushes_through_haproxy_land_by_cluster_id(tmp_path: Path, transport: str) -> None:
    """Without the cluster id header HAProxy would spread one cluster's requests (HTTP
    requests, gRPC calls on one HTTP/2 connection) over every replica."""
    reason = hap.missing_reason()
    if reason:
        pytest.skip(reason)
    ports = slurm.free_ports(12)
    fleets: list[Fleet] = []
    balancer = None
    names = ("otlp_http", "otlp_grpc", "api")
    try:
        servers = []
        for i in range(3):
            p = dict(zip(names, ports[3 * i : 3 * i + 3], strict=True))
            (tmp_path / f"f{i}").mkdir()
            config = {"listen": {k: f"127.0.0.1:{v}" for k, v in p.items()}}
            fleets.append(start_fleet(tmp_path / f"f{i}", config))
            servers.append({"name": f"f{i}", "host": "127.0.0.1", **p})
        balancer = hap.start_haproxy(tmp_path, servers, ports[9:12])
        endpoint = f"http://{balancer.otlp_http}" if transport == "http" else balancer.otlp_grpc
        clusters = [f"k{i:02d}" for i in range(12)]
        for cluster in clusters:
            config = PushConfig(
                fleet_endpoint=endpoint,
                transport=transport,  # type: ignore[arg-type]
                cluster_id=cluster,
            )
            client: PushClient = (
                HttpPushClient(config) if transport == "http" else GrpcPushClient(config)
            )
            try:
                for n in range(6):  # six requests of one cluster, one channel for gRPC
                    node = NodePush(f"{cluster}-n{n}", cluster, 0.9, "active", job_id="j")
                    assert client.push(health_request([node])).ok
            finally:
                client.close()

        def placed() -> dict[str, list[int]] | None:
            out = {
                c: [i for i, f in enumerate(fleets) if f.threshold(c, "j").status == 200]
                for c in clusters
            }
            return out if all(out.values()) else None

        where = wait_for(placed, 10, "every cluster placed")
        assert all(len(on) == 1 for on in where.values()), where
        assert {on[0] for on in where.values()} == {0, 1, 2}, where
        for c, (i,) in where.items():  # all six nodes of the cluster on that replica
            # active_nodes is the last tick's count: a tick may have run between two of the
            # six pushes, so wait for the next one rather than read it at once.
            wait_for(
                lambda c=c, i=i: fleets[i].threshold(c, "j").json()["active_nodes"] == 6,
                10,
                f"all six nodes of {c} counted on f{i}",
            )
    finally:
        if balancer is not None:
            balancer.stop()
        for f in fleets:
            f.stop()
