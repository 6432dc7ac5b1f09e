"""A bearer token's cluster scope, one value type for Fleet and Echo.

A scoped token reaches only the clusters of its scope, an unscoped one (None) every
cluster; a cluster id is compared exactly, code point for code point. Fleet sets a token's
scope in ``auth.token_clusters``, Echo in its token table's ``clusters``; both carry it as
the payload of the token's :class:`~ingero.security.bearer.Identity`.
"""

from __future__ import annotations

from collections.abc import Iterable

ClusterScope = frozenset[str] | None
"""The clusters a token may reach; None: every cluster."""


def covers(scope: ClusterScope, cluster_id: str) -> bool:
    """Whether ``scope`` reaches ``cluster_id``."""
    return scope is None or cluster_id in scope


def outside_scope(scope: ClusterScope, clusters: Iterable[str]) -> str | None:
    """The first of ``clusters`` that ``scope`` does not cover, None when it covers them
    all. An unscoped token is not looked at further: ``clusters`` is never iterated."""
    if scope is None:
        return None
    for cluster_id in clusters:
        if cluster_id not in scope:
            return cluster_id
    return None
