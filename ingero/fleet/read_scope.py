"""What a scoped Fleet token may read: the API and ``/metrics`` limited to its clusters.

The rule is Echo's and the push side's (:mod:`ingero.fleet.scope`): a token named in
``auth.token_clusters`` reads only its clusters; an unscoped token (and every request while
authentication is off) reads everything. A cluster id is compared exactly, code point for
code point (no case folding, no Unicode normalisation, percent-escapes decoded once), as
everything Fleet stores is keyed by the exact id: a variant of a cluster id is another
cluster, and never reaches the data of the one it resembles.

A request naming a cluster outside the scope is refused (403) before anything is looked
up, so the answer is the same whether that cluster exists or not; the refusal names the
token, never the cluster, and no answer to the API repeats an id the caller sent (see
:mod:`ingero.fleet.api`). A scoped token's ``/metrics`` holds only the series labelled
with its clusters; the Fleet-wide series sum every tenant's traffic and stay the
operators'.
"""

from __future__ import annotations

from ingero.security.bearer import Identity
from ingero.security.scope import ClusterScope, covers

# The counted (ingero_fleet_rejected_total) and audited reason of a refused read; not the
# push side's cluster_not_allowed, so an alert on misconfigured nodes does not fire on a
# tenant probing the API, and the other way round.
CLUSTER_READ_NOT_ALLOWED = "cluster_read_not_allowed"


def scope_of(identity: Identity[ClusterScope] | None) -> ClusterScope:
    """The clusters ``identity``'s token may read; None (every cluster) for an unscoped
    token or with authentication off (no identity)."""
    return None if identity is None else identity.payload


def may_read(scope: ClusterScope, cluster_id: str) -> bool:
    return covers(scope, cluster_id)


def read_refusal(identity: Identity[ClusterScope] | None) -> str:
    """The one-line reason of a refused read: the token, not the cluster it named."""
    name = identity.name if identity is not None and identity.name else "this token"
    return f"token {name} may read only the clusters of its scope (auth.token_clusters)"
