"""Fleet tokens scoped to clusters (``auth.token_clusters``): which token may push for which
cluster, decided in one place for both OTLP transports.

A token named in ``auth.token_clusters`` may push only scores and events of its clusters;
a token not named there (and every request while authentication is off) is unscoped. The
scope rides on the token's :class:`~ingero.security.bearer.Identity` (its payload), so it is
replaced with the tokens on SIGHUP and a request is judged by the scope its token had when
the gate let it in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ingero.otlp.receiver import RequestError
from ingero.runtime.errors import ConfigError
from ingero.security.bearer import Identity, NamedToken
from ingero.security.scope import ClusterScope, outside_scope

# The counted (ingero_fleet_rejected_total) and audited reason of a refusal.
CLUSTER_NOT_ALLOWED = "cluster_not_allowed"


def scoped_tokens(
    tokens: Iterable[NamedToken[None]], token_clusters: Mapping[str, list[str]]
) -> list[NamedToken[ClusterScope]]:
    """``tokens`` with their scopes attached; a ConfigError naming a scoped token that is
    not among them (a typo would otherwise leave the real token unscoped, silently)."""
    tokens = list(tokens)
    names = {t.name for t in tokens}
    unknown = sorted(set(token_clusters) - names)
    if unknown:
        known = ", ".join(sorted(names)) or "none"
        raise ConfigError(
            f"auth.token_clusters: no token is named {unknown[0]!r} "
            f"(token names are their files' names: {known})"
        )
    return [
        NamedToken(
            t.name,
            t.digest,
            frozenset(token_clusters[t.name]) if t.name in token_clusters else None,
        )
        for t in tokens
    ]


def check_scope(identity: Identity[ClusterScope] | None, clusters: Iterable[str]) -> None:
    """Raise the 403 (PERMISSION_DENIED over gRPC) that refuses a whole request holding a
    cluster outside the scope of ``identity``'s token (None: authentication off)."""
    if identity is None:
        return
    cluster_id = outside_scope(identity.payload, clusters)
    if cluster_id is not None:
        raise RequestError(
            403,
            CLUSTER_NOT_ALLOWED,
            f"token {identity.name} may not push for cluster {cluster_id}",
        )
