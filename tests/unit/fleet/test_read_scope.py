"""Fleet's read side scoped to a token's clusters: the API handler behind the real gate
(refusal before lookup, one answer for every cluster out of scope, counted, audited, and
held back per source like a wrong token), and ``/metrics`` filtered to the scope's series.
The daemon end to end, with fleet-push processes: tests/integration/fleet/test_read_scopes.py.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from ingero.fleet.api import ApiHandler
from ingero.fleet.config import FleetConfig
from ingero.fleet.httpserver import HttpRequest, HttpResponse
from ingero.fleet.metrics import FleetMetrics
from ingero.fleet.read_scope import CLUSTER_READ_NOT_ALLOWED
from ingero.fleet.state import FleetState
from ingero.otlp.health import NodePush
from ingero.runtime.clock import ManualClock
from ingero.runtime.journald import JournalWriter
from ingero.security.access import SOURCE_RATE_LIMITED, Gate
from ingero.security.audit import REFUSED, AuditLog
from ingero.security.bearer import Keyring, NamedToken, digest
from ingero.security.ratelimit import RateLimitConfig
from ingero.security.scope import ClusterScope
from tests.unit.fleet.test_scope import journal_fields

RACK_A = frozenset({"A"})


def fleet(clock: ManualClock) -> tuple[FleetState, FleetMetrics]:
    """Clusters A and B, a job each (and job 7 in both), ticked, with per-node series."""
    state = FleetState(FleetConfig(), clock)
    metrics = FleetMetrics(node_series_limit=100)
    for i, (cluster, job) in enumerate([("A", "7"), ("B", "7"), ("B", "b-only")]):
        for n in range(3):
            node = f"{cluster.lower()}-node-{i}{n}"
            state.ingest(NodePush(node_id=node, cluster_id=cluster, score=0.9, job_id=job))
    result = state.tick()
    metrics.update_groups(result.groups)
    metrics.update_nodes(state.scores_snapshot(100), set(), 9)
    metrics.update_clock_offsets([("A", "a-node-00", 0.1, 0.01), ("B", "b-node-10", 0.2, 0.01)])
    return state, metrics


def test_scoped_metrics_hold_only_their_clusters_series() -> None:
    _, metrics = fleet(ManualClock(1_700_000_000.0))
    everything = metrics.render()
    assert b'cluster_id="B"' in everything and b"b-only" in everything
    text = metrics.render_clusters(RACK_A).decode()
    labelled = [
        sample for family in text_string_to_metric_families(text) for sample in family.samples
    ]
    assert {s.labels["cluster_id"] for s in labelled} == {"A"}  # and every sample has one
    names = {s.name for s in labelled}
    assert {"ingero_fleet_threshold", "ingero_fleet_node_score"} <= names
    assert "ingero_fleet_node_clock_offset_seconds" in names
    assert "b-node" not in text and "b-only" not in text
    # the Fleet-wide series sum every tenant's: the operators' only
    assert "ingero_fleet_requests" not in text and "ingero_fleet_node_series_omitted" not in text
    assert metrics.render_clusters(frozenset({"C"})).count(b"cluster_id") == 0


def request(target: str, token: str | None = "rack-a") -> HttpRequest:
    path, _, query = target.partition("?")
    headers = {"authorization": f"Bearer token-of-{token}"} if token else {}
    return HttpRequest("GET", path, query, headers, peer="10.0.0.9")


def serve(api: ApiHandler, req: HttpRequest) -> HttpResponse:
    """What the HTTP server does with a request: its gate first, then its handler."""
    return api.gate(req, 0) or api(req)


def test_reads_outside_the_scope_are_refused_counted_audited_and_limited(
    tmp_path: Path,
) -> None:
    clock = ManualClock(1_700_000_000.0)
    state, metrics = fleet(clock)
    journal = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    journal.bind(str(tmp_path / "journal"))
    journal.settimeout(5)
    audit = AuditLog("fleet", window=3600, writer=JournalWriter(str(tmp_path / "journal")))
    ring: Keyring[ClusterScope] = Keyring(
        [
            NamedToken("rack-a", digest("token-of-rack-a"), RACK_A),
            NamedToken("ops", digest("token-of-ops"), None),
        ]
    )
    limits = RateLimitConfig(refusals_per_source=1.0, refusal_burst=3)
    api = ApiHandler(state, metrics, Gate(ring, None, limits, audit, clock), lambda: True)
    try:
        assert serve(api, request("/api/v1/threshold?cluster_id=A&job_id=7")).status == 200
        # B's group, a job only B has, a cluster no one has: one answer, naming no cluster
        answers = [
            serve(api, request(f"/api/v1/threshold?{q}"))
            for q in ("cluster_id=B&job_id=7", "cluster_id=B&job_id=b-only", "cluster_id=nowhere")
        ]
        assert {(a.status, a.body) for a in answers} == {
            (403, b'{"error": "token rack-a may read only the clusters of its scope '
             b'(auth.token_clusters)", "status": 403}\n')
        }  # fmt: skip
        # a job only B has, asked within A: as unknown as any other
        missing = serve(api, request("/api/v1/threshold?cluster_id=A&job_id=b-only"))
        assert missing.status == 404 and b"b-only" not in missing.body
        # past the source's burst of refusals: 429, while what A may read still answers
        over = serve(api, request("/api/v1/threshold?cluster_id=B"))
        assert over.status == 429 and ("Retry-After", "1") in over.headers
        assert json.loads(over.body)["error"].startswith("too many refused requests")
        assert serve(api, request("/api/v1/threshold?cluster_id=A&job_id=7")).status == 200
        # the unscoped token reads B; no token from that address now spends from the same,
        # empty bucket: 429, not 401
        assert serve(api, request("/api/v1/threshold?cluster_id=B&job_id=7", "ops")).status == 200
        assert serve(api, request("/metrics", None)).status == 429
        assert b'cluster_id="B"' not in serve(api, request("/metrics")).body
        written = audit.flush()
        entries = [dict(journal_fields(journal.recv(65536))) for _ in range(written)]
    finally:
        audit.close()
        journal.close()
    refused = {
        (e["INGERO_REASON"], e.get("INGERO_TOKEN_NAME", ""), e["INGERO_COUNT"])
        for e in entries
        if e["INGERO_OUTCOME"] == REFUSED and e["INGERO_LISTENER"] == "api"
    }
    assert (CLUSTER_READ_NOT_ALLOWED, "rack-a", "3") in refused
    assert (SOURCE_RATE_LIMITED, "rack-a", "1") in refused
    assert (SOURCE_RATE_LIMITED, "", "1") in refused  # the request without a token
    counted = {
        s.labels["reason"]: s.value
        for f in text_string_to_metric_families(metrics.render().decode())
        for s in f.samples
        if s.name == "ingero_fleet_rejected_total"
    }
    assert counted[CLUSTER_READ_NOT_ALLOWED] == 3 and counted[SOURCE_RATE_LIMITED] == 2
