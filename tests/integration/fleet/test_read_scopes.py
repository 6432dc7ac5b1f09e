"""Fleet's read side scoped like its push side and like Echo: a token scoped to cluster A
reads, over every read surface, only cluster A, however it names another cluster.

A real ``ingero fleet`` with three tokens (rack-a scoped to ``tenant-a``, rack-b to
``tenant-b``, ops unscoped); real ``ingero workload`` + ``ingero fleet-push`` pairs push
cluster A (Slurm job 4242) with rack-a's token and cluster B (job 4242 too, and job
``bravo-job-9001`` that exists only in B) with rack-b's. The ops token adds cluster
``tenant-a/job/x`` (job ``y``), whose group key ``tenant-a/job/x/job/y`` is also what
cluster A's job ``x/job/y`` would be.

Each attempt of rack-a's is a row of CASES with the status it must get, and every answer
to rack-a (status line, headers and body) is searched, case-insensitively, for any byte of
B's identifiers (its cluster id, node ids, the job id only B has, the colliding cluster's
id): none may be there. Every 403 is the same one line, whether the cluster exists or not.
The refusals are counted, a scope changed in the file applies to reads on SIGHUP, and an
address over its rate of refusals gets 429.
"""

from __future__ import annotations

import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import yaml

from ingero.otlp.health import NodePush
from tests.integration.fleet.helpers import Fleet, Reply
from tests.integration.fleet.helpers import wait_for as wait_until
from tests.integration.push.cluster import Cluster, Procs, wait_for

pytestmark = pytest.mark.integration

INTERVAL = 0.5
TOKENS = {"rack-a": "rack-a-read-token-0123", "rack-b": "rack-b-read-token-4567", "ops": "ops-0000"}
SCOPES = {"rack-a": ["tenant-a"], "rack-b": ["tenant-b"]}
JOB = "4242"  # in both clusters
B_ONLY_JOB = "73917391"  # digits, as Slurm job ids are; in no figure by chance
COLLIDING = "tenant-a/job/x"  # cluster x/job/y of A would share its group key
# What of B no answer to rack-a may hold (compared case-insensitively).
B_IDS = ("tenant-b", "bravo", B_ONLY_JOB, COLLIDING)
# Refused reads an address may make in a burst: more than CASES refuse, so only the last
# step of the test reaches it; the refill is too slow to matter within a test.
REFUSAL_BURST = 150

T = "/api/v1/threshold"


def fullwidth(text: str) -> str:
    """``text`` with its ASCII letters as their fullwidth forms (NFKC maps them back)."""
    return "".join(chr(ord(c) + 0xFEE0) if c.isascii() and c.isalpha() else c for c in text)


FW_TENANT_B = quote(fullwidth("tenant-b"))
FW_TENANT_A = quote(fullwidth("tenant-a"))

# (method, target, status) as rack-a sends them.
CASES: list[tuple[str, str, int]] = [
    # its own cluster, in every form the API takes
    ("GET", f"{T}?cluster_id=tenant-a&job_id={JOB}", 200),
    ("GET", f"{T}?job_id={JOB}&cluster_id=tenant-a", 200),
    ("GET", f"{T}?cluster_id=%74enant%2Da&job_id=%34242", 200),  # escapes, decoded once
    ("GET", f"{T}?cluster_id=tenant-a&job_id={JOB}&node_id=alpha-node00", 200),
    ("GET", f"{T}?cluster_id=tenant-a&job_id={JOB}&node_id=bravo-node00", 200),  # B's node
    ("GET", f"{T}?cluster_id=tenant-a&job_id={JOB}&unknown=tenant-b", 200),
    ("HEAD", f"{T}?cluster_id=tenant-a&job_id={JOB}", 200),
    # its own cluster, groups it does not have: as unknown as any
    ("GET", f"{T}?cluster_id=tenant-a&job_id={B_ONLY_JOB}", 404),  # a job only B has
    ("GET", f"{T}?cluster_id=tenant-a&job_id=no-such-job", 404),
    ("GET", f"{T}?cluster_id=tenant-a&job_id=x/job/y", 404),  # the colliding group key
    ("GET", f"{T}?cluster_id=tenant-a&job_id=x%2Fjob%2Fy", 404),
    ("GET", f"{T}?cluster_id=tenant-a&job_id=../tenant-b/job/{JOB}", 404),
    ("GET", f"{T}?cluster_id=tenant-a&workload_type=../../tenant-b/job/{JOB}", 404),
    ("GET", f"{T}?cluster_id=tenant-a&workload_type=training", 404),
    # another cluster, every way of naming it: 403 before any lookup
    ("GET", f"{T}?cluster_id=tenant-b", 403),
    ("GET", f"{T}?cluster_id=tenant-b&job_id={JOB}", 403),
    ("GET", f"{T}?cluster_id=tenant-b&job_id={B_ONLY_JOB}", 403),
    ("GET", f"{T}?cluster_id=tenant-b&job_id={B_ONLY_JOB}&node_id=bravo-solo00", 403),
    ("GET", f"{T}?cluster_id=tenant-b&job_id={JOB}&node_id=alpha-node00", 403),
    ("GET", f"{T}?cluster_id=tenant-b&workload_type=training", 403),
    ("GET", f"{T}?cluster_id=tenant-b&job_id=no-such-job", 403),
    ("GET", f"{T}?cluster_id=no-such-cluster", 403),  # the same answer as for B
    ("HEAD", f"{T}?cluster_id=tenant-b&job_id={JOB}", 403),
    ("GET", f"{T}?cluster_id=%74enant-b&job_id={JOB}", 403),
    ("GET", f"{T}?cluster_id=%2574enant-b&job_id={JOB}", 403),  # not decoded twice
    ("GET", f"{T}?cluster_id=TENANT-B&job_id={JOB}", 403),
    ("GET", f"{T}?cluster_id=Tenant-B&job_id={JOB}", 403),
    ("GET", f"{T}?cluster_id={FW_TENANT_B}&job_id={JOB}", 403),  # NFKC: tenant-b
    ("GET", f"{T}?cluster_id=tenant%E2%80%90b&job_id={JOB}", 403),  # U+2010 hyphen
    ("GET", f"{T}?cluster_id=tenant-b%00&job_id={JOB}", 403),
    ("GET", f"{T}?cluster_id=tenant-b+&job_id={JOB}", 403),
    ("GET", f"{T}?cluster_id=tenant-b%23x&job_id={JOB}", 403),
    ("GET", f"{T}?cluster_id=tenant-a/../tenant-b&job_id={JOB}", 403),
    ("GET", f"{T}?cluster_id=tenant-a;cluster_id=tenant-b&job_id={JOB}", 403),
    ("GET", f"{T}?cluster_id={COLLIDING}&job_id=y", 403),
    # variants of its own cluster are other clusters (exact match), never A's data or B's
    ("GET", f"{T}?cluster_id=TENANT-A&job_id={JOB}", 403),
    ("GET", f"{T}?cluster_id={FW_TENANT_A}&job_id={JOB}", 403),
    ("GET", f"{T}?cluster_id=tenant-a%20&job_id={JOB}", 403),
    # repeated or missing parameters: refused as ambiguous, nothing looked up
    ("GET", f"{T}?cluster_id=tenant-b&cluster_id=tenant-a&job_id={JOB}", 400),
    ("GET", f"{T}?cluster_id=tenant-a&cluster_id=tenant-b&job_id={JOB}", 400),
    ("GET", f"{T}?cluster_id=tenant-a&job_id={JOB}&job_id={B_ONLY_JOB}", 400),
    ("GET", f"{T}?cluster_id=tenant-a&job_id={JOB}&node_id=a&node_id=bravo-node00", 400),
    ("GET", f"{T}?job_id={B_ONLY_JOB}", 400),  # a job without a cluster resolves nowhere
    ("GET", f"{T}?node_id=bravo-node00", 400),
    ("GET", f"{T}?CLUSTER_ID=tenant-b&job_id={JOB}", 400),
    ("GET", f"{T}?cluster_id%5B%5D=tenant-b", 400),
    ("GET", f"{T}?cluster_id=tenant-a&tenant-b", 400),
    # path tricks: no such path, whatever the query names
    ("GET", f"/{T}?cluster_id=tenant-b&job_id={JOB}", 404),
    ("GET", f"{T}/?cluster_id=tenant-b&job_id={JOB}", 404),
    ("GET", f"{T}/..?cluster_id=tenant-b&job_id={JOB}", 404),
    ("GET", f"/api/v1/./threshold?cluster_id=tenant-b&job_id={JOB}", 404),
    ("GET", f"/api/v1/x/../threshold?cluster_id=tenant-b&job_id={JOB}", 404),
    ("GET", f"/api/v1/%74hreshold?cluster_id=tenant-b&job_id={JOB}", 404),
    ("GET", f"/API/V1/THRESHOLD?cluster_id=tenant-b&job_id={JOB}", 404),
    ("GET", f"{T}/tenant-b/job/{JOB}", 404),
    ("GET", f"{T}%3Fcluster_id=tenant-b", 404),
    ("GET", "/api/v1/groups?cluster_id=tenant-b", 404),  # no listing exists
    ("GET", "/api/v1/nodes", 404),
    ("GET", "/metrics/", 404),
    # the other surfaces
    ("GET", "/metrics", 200),
    ("GET", "/metrics?cluster_id=tenant-b", 200),
    ("HEAD", "/metrics", 200),
    ("GET", "/healthz", 200),
    ("GET", "/readyz", 200),
]
REFUSED_CASES = sum(1 for _, _, status in CASES if status == 403)


def raw_get(fleet: Fleet, target: bytes, token: str) -> Reply:
    """A request line as bytes, unencoded (http.client refuses non-ASCII targets)."""
    host, _, port = fleet.api.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(
            b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Authorization: Bearer " + token.encode() + b"\r\n\r\n"
        )
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in header_lines)
    return Reply(int(status_line.split(" ")[1]), headers, body)


def leaked(reply: Reply, ids: tuple[str, ...] = B_IDS) -> list[str]:
    """Those of ``ids`` whose bytes are anywhere in the reply, in any letter case."""
    everything = (repr(reply.headers).encode() + reply.body).lower()
    return [i for i in ids if i.lower().encode() in everything]


def as_token(fleet: Fleet, name: str) -> Fleet:
    fleet.token = TOKENS[name]
    return fleet


def refused_reads(fleet: Fleet) -> float:
    as_token(fleet, "ops")
    return fleet.metric("ingero_fleet_rejected_total", reason="cluster_read_not_allowed")


def has_node_series(fleet: Fleet, node: str) -> bool:
    """Whether ops's /metrics has the node's score (once it is active, after calibrating)."""
    samples = as_token(fleet, "ops").metrics()
    return any(n == "ingero_fleet_node_score" and ("node_id", node) in ls for n, ls in samples)


@pytest.fixture
def tenants(tmp_path: Path) -> Iterator[Fleet]:
    """Fleet with clusters A and B pushed by real fleet-push processes, as ops sees it."""
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    for name, token in TOKENS.items():
        (tokens / name).write_text(token + "\n")
    procs = Procs()
    auth: dict[str, Any] = {
        "token_dir": str(tokens),
        "token_clusters": SCOPES,
        "rate_limit": {"refusals_per_source": 0.001, "refusal_burst": REFUSAL_BURST},
    }

    def cluster(name: str, **kw: Any) -> Cluster:
        (tmp_path / name).mkdir()
        return Cluster(tmp_path / name, procs, INTERVAL, 1, **kw)

    a = cluster(
        "a",
        job_id=JOB,
        cluster_id="tenant-a",
        node_prefix="alpha-node",
        token_file=tokens / "rack-a",
        # ttl: the colliding cluster's one push stays for the whole test
        fleet_config={"auth": auth, "metrics": {"node_series": True}, "ttl_multiplier": 1000},
    )
    bs = [
        cluster(
            "b",
            job_id=JOB,
            cluster_id="tenant-b",
            node_prefix="bravo-node",
            token_file=tokens / "rack-b",
        ),
        cluster(
            "b2",
            job_id=B_ONLY_JOB,
            cluster_id="tenant-b",
            node_prefix="bravo-solo",
            token_file=tokens / "rack-b",
        ),
    ]
    try:
        a.start_fleet()
        for c in (a, *bs):
            c.ports = a.ports
            c.start_workload(0)
            c.start_push(0)
        api = f"127.0.0.1:{a.ports['api']}"
        fleet = Fleet(a.fleet, "", f"127.0.0.1:{a.ports['otlp_http']}", api, a.tmp / "fleet.log")
        as_token(fleet, "ops")
        collide = NodePush(node_id="bravo-collide", cluster_id=COLLIDING, job_id="y", score=0.8)
        assert fleet.push([collide]).status == 200
        for cluster_id, job_id in (("tenant-a", JOB), ("tenant-b", JOB), ("tenant-b", B_ONLY_JOB)):
            wait_for(
                lambda c=cluster_id, j=job_id: as_token(fleet, "ops").threshold(c, j).status == 200,
                90,
                f"the group of {cluster_id} job {job_id}, from its fleet-push",
            )
        for node in ("alpha-node00", "bravo-node00", "bravo-solo00"):
            wait_for(lambda n=node: has_node_series(fleet, n), 90, f"the node series of {node}")
        wait_for(
            lambda: COLLIDING.encode() in fleet.request(api, "GET", "/metrics").body,
            60,
            "the colliding cluster's group series",
        )
        yield fleet
    finally:
        procs.stop_all()
    assert "Traceback" not in (tmp_path / "a" / "fleet.log").read_text()


def test_a_scoped_token_reads_only_its_clusters_on_every_surface(tenants: Fleet) -> None:
    fleet = tenants
    # The data is there: the unscoped token reads all of B, so a leak would show.
    ops = as_token(fleet, "ops")
    assert ops.threshold("tenant-b", B_ONLY_JOB).json()["cluster_id"] == "tenant-b"
    assert leaked(ops.request(fleet.api, "GET", "/metrics")) == list(B_IDS)
    assert ops.threshold(COLLIDING, "y").json()["group"] == "tenant-a/job/x/job/y"
    # the key A's job x/job/y would have is that group's, and is not A's, whoever asks
    assert ops.threshold("tenant-a", "x/job/y").status == 404

    failures = []
    forbidden: set[bytes] = set()
    for method, target, status in CASES:
        reply = as_token(fleet, "rack-a").request(fleet.api, method, target)
        if reply.status != status or leaked(reply):
            failures.append(f"{method} {target}: {reply.status} {leaked(reply)} {reply.body!r}")
        if reply.status == 403 and method == "GET":
            forbidden.add(reply.body)
    assert not failures, "\n".join(failures)
    # One answer for every cluster out of scope, existing or not: nothing to tell them by.
    assert forbidden == {
        b'{"error": "token rack-a may read only the clusters of its scope (auth.token_clusters)", '
        b'"status": 403}\n'
    }
    assert refused_reads(fleet) == REFUSED_CASES

    # What a 200 holds is A's alone: its group, its node's ratios, its series
    a = as_token(fleet, "rack-a")
    view = a.threshold("tenant-a", JOB, node_id="alpha-node00").json()
    assert (view["cluster_id"], view["group"]) == ("tenant-a", f"tenant-a/job/{JOB}")
    # B's node named in A's group: A's group view, nothing of that node
    theirs = a.threshold("tenant-a", JOB, node_id="bravo-node00").json()
    assert theirs["cluster_id"] == "tenant-a"
    assert (theirs["rate_ratios"], theirs["episode_id"], theirs["peer_lag"]) == (None, None, None)
    text = a.request(fleet.api, "GET", "/metrics").body.decode()
    assert 'ingero_fleet_node_score{cluster_id="tenant-a"' in text
    assert f'ingero_fleet_active_nodes{{cluster_id="tenant-a",group="tenant-a/job/{JOB}"}}' in text
    assert "ingero_fleet_requests_total" not in text  # Fleet-wide: the operators'

    # Raw bytes on the request line (not percent-encoded): other clusters all the same
    for target in (fullwidth("tenant-b"), "tenant-b\u00ad", fullwidth("tenant-a")):
        reply = raw_get(fleet, f"{T}?cluster_id={target}&job_id={JOB}".encode(), TOKENS["rack-a"])
        assert reply.status == 403 and not leaked(reply), reply

    # The other way round: B's token reads B, not A
    b = as_token(fleet, "rack-b")
    assert b.threshold("tenant-b", B_ONLY_JOB).status == 200
    assert b.threshold("tenant-a", JOB).status == 403
    assert b"alpha" not in b.request(fleet.api, "GET", "/metrics").body
    assert refused_reads(fleet) == REFUSED_CASES + 4


def test_scopes_reload_for_reads_and_refusals_are_rate_limited(
    tenants: Fleet, tmp_path: Path
) -> None:
    fleet = tenants
    config_path = tmp_path / "a" / "fleet.yaml"
    config = yaml.safe_load(config_path.read_text())
    proc = fleet.proc
    assert proc is not None

    def reload(scopes: dict[str, list[str]], times: int) -> None:
        config["auth"]["token_clusters"] = scopes
        config_path.write_text(yaml.safe_dump(config))
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: fleet.log().count("reloaded 3 token(s)") >= times, what="the reload")

    a = as_token(fleet, "rack-a")
    assert a.threshold("tenant-b", JOB).status == 403
    reload({"rack-a": ["tenant-a", "tenant-b"], "rack-b": ["tenant-b"]}, 1)
    assert as_token(fleet, "rack-a").threshold("tenant-b", JOB).status == 200
    assert b"bravo-node00" in fleet.request(fleet.api, "GET", "/metrics").body
    reload(SCOPES, 2)
    assert as_token(fleet, "rack-a").threshold("tenant-b", JOB).status == 403
    assert b"bravo" not in fleet.request(fleet.api, "GET", "/metrics").body

    # Refused reads from one address are held back like refused tokens: 429 past the burst
    for _ in range(REFUSAL_BURST + 1):
        reply = as_token(fleet, "rack-a").threshold("tenant-b", JOB)
        if reply.status == 429:
            break
        assert reply.status == 403
    assert reply.status == 429 and int(reply.headers["retry-after"]) >= 1 and not leaked(reply)
    assert reply.json()["error"] == "too many refused requests from this address; retry later"
    # what the token may read, it still reads from that address
    assert as_token(fleet, "rack-a").threshold("tenant-a", JOB).status == 200
    as_token(fleet, "ops")
    assert fleet.metric("ingero_fleet_rejected_total", reason="source_rate_limited") == 1
