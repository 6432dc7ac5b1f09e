"""Bearer tokens, each optionally scoped to clusters.

The token table (YAML, ``auth.token_table``) lists ``{name, token | sha256, clusters}``
entries; ``clusters`` absent means every cluster. The entries go into the shared :class:`~ingero.security.bearer.Keyring`
(tokens looked up by SHA-256 digest, reloaded on SIGHUP with a grace window for removed
ones); only an entry's ``name`` and token id are ever logged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from ingero.runtime.clock import Clock
from ingero.runtime.errors import ConfigError
from ingero.security.bearer import Identity, Keyring, NamedToken, digest
from ingero.security.scope import ClusterScope, covers

# A token table lists a few hundred entries at most; it is not read past this.
MAX_TOKENS_FILE_BYTES = 1024 * 1024


class AccessDenied(Exception):
    """The caller's token does not cover the cluster it asked for."""


@dataclass(frozen=True)
class Principal:
    """Who is asking: ``clusters`` None means every cluster."""

    name: str
    clusters: ClusterScope = None

    def allows(self, cluster_id: str) -> bool:
        return covers(self.clusters, cluster_id)

    def require(self, cluster_id: str | None) -> None:
        if cluster_id is not None and not self.allows(cluster_id):
            raise AccessDenied(f"this token has no access to cluster {cluster_id!r}")


ANONYMOUS = Principal("anonymous")


def principal(identity: Identity[ClusterScope]) -> Principal:
    """The principal of an identity the shared gate admitted (no name: authentication off)."""
    return Principal(identity.name, identity.payload) if identity.name else ANONYMOUS


class TokenTable:
    """The configured tokens; an empty table (no file) means authentication is off."""

    def __init__(
        self,
        entries: list[NamedToken[ClusterScope]],
        grace: float = 300.0,
        clock: Clock | None = None,
    ) -> None:
        self.keyring: Keyring[ClusterScope] = Keyring(entries, grace, clock)

    @property
    def enabled(self) -> bool:
        return self.keyring.enabled

    @classmethod
    def load(cls, path: str | None, grace: float = 300.0) -> TokenTable:
        return cls(cls.read(path), grace)

    @classmethod
    def read(cls, path: str | None) -> list[NamedToken[ClusterScope]]:
        if path is None:
            return []
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_TOKENS_FILE_BYTES + 1)
            if len(data) > MAX_TOKENS_FILE_BYTES:
                raise ConfigError(f"{path}: token table over {MAX_TOKENS_FILE_BYTES} bytes")
            raw = yaml.safe_load(data.decode())
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise ConfigError(f"{path}: cannot read token table: {exc}") from None
        return cls.entries(raw, path)

    @classmethod
    def parse(cls, raw: Any, source: str) -> TokenTable:
        return cls(cls.entries(raw, source))

    @classmethod
    def entries(cls, raw: Any, source: str) -> list[NamedToken[ClusterScope]]:
        tokens = raw.get("tokens") if isinstance(raw, dict) else None
        if not isinstance(tokens, list) or not tokens:
            raise ConfigError(f"{source}: expected a non-empty list under 'tokens'")
        entries: list[NamedToken[ClusterScope]] = []
        for i, item in enumerate(tokens):
            where = f"{source}: tokens[{i}]"
            if not isinstance(item, dict):
                raise ConfigError(f"{where}: expected a mapping")
            unknown = set(item) - {"name", "token", "sha256", "clusters"}
            if unknown:
                raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r}")
            name = item.get("name")
            if not isinstance(name, str) or not name:
                raise ConfigError(f"{where}: 'name' must be a non-empty string")
            token, sha = item.get("token"), item.get("sha256")
            if (token is None) == (sha is None):
                raise ConfigError(f"{where}: give exactly one of 'token' or 'sha256'")
            if token is not None:
                if not isinstance(token, str) or len(token) < 16:
                    raise ConfigError(f"{where}: 'token' must be a string of 16+ characters")
                token_digest = digest(token)
            else:
                try:
                    token_digest = bytes.fromhex(str(sha))
                except ValueError:
                    token_digest = b""
                if len(token_digest) != 32:
                    raise ConfigError(f"{where}: 'sha256' must be 64 hex digits")
            clusters = item.get("clusters")
            if clusters is not None and (
                not isinstance(clusters, list)
                or not all(isinstance(c, str) and c for c in clusters)
            ):
                raise ConfigError(f"{where}: 'clusters' must be a list of cluster ids")
            entries.append(
                NamedToken(
                    name, token_digest, frozenset(clusters) if clusters is not None else None
                )
            )
        return entries

    def authenticate(self, authorization: str | None) -> Principal | None:
        """The principal for an ``Authorization`` header value, or None when it is not valid."""
        if not self.keyring.enabled:
            return ANONYMOUS
        identity = self.keyring.check(authorization).identity
        return principal(identity) if identity is not None else None
