"""Bearer tokens, each optionally scoped to clusters.

The tokens file (YAML) lists ``{name, token | sha256, clusters}`` entries; ``clusters``
absent means every cluster. Tokens are compared as SHA-256 digests with
``hmac.compare_digest`` against every entry, so timing says nothing about which or how
much matched; only the entry's ``name`` is ever logged.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ingero.errors import ConfigError


class AccessDenied(Exception):
    """The caller's token does not cover the cluster it asked for."""


@dataclass(frozen=True)
class Principal:
    """Who is asking: ``clusters`` None means every cluster."""

    name: str
    clusters: frozenset[str] | None = None

    def allows(self, cluster_id: str) -> bool:
        return self.clusters is None or cluster_id in self.clusters

    def require(self, cluster_id: str | None) -> None:
        if cluster_id is not None and not self.allows(cluster_id):
            raise AccessDenied(f"this token has no access to cluster {cluster_id!r}")


ANONYMOUS = Principal("anonymous")


@dataclass(frozen=True)
class _Entry:
    name: str
    digest: bytes
    clusters: frozenset[str] | None


class TokenTable:
    """The configured tokens; an empty table (no file) means authentication is off."""

    def __init__(self, entries: list[_Entry]) -> None:
        self._entries = entries

    @property
    def enabled(self) -> bool:
        return bool(self._entries)

    @classmethod
    def load(cls, path: str | None) -> TokenTable:
        if path is None:
            return cls([])
        try:
            raw = yaml.safe_load(Path(path).read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise ConfigError(f"{path}: cannot read tokens file: {exc}") from None
        return cls.parse(raw, path)

    @classmethod
    def parse(cls, raw: Any, source: str) -> TokenTable:
        tokens = raw.get("tokens") if isinstance(raw, dict) else None
        if not isinstance(tokens, list) or not tokens:
            raise ConfigError(f"{source}: expected a non-empty list under 'tokens'")
        entries: list[_Entry] = []
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
                digest = hashlib.sha256(token.encode()).digest()
            else:
                try:
                    digest = bytes.fromhex(str(sha))
                except ValueError:
                    digest = b""
                if len(digest) != 32:
                    raise ConfigError(f"{where}: 'sha256' must be 64 hex digits")
            clusters = item.get("clusters")
            if clusters is not None and (
                not isinstance(clusters, list)
                or not all(isinstance(c, str) and c for c in clusters)
            ):
                raise ConfigError(f"{where}: 'clusters' must be a list of cluster ids")
            entries.append(
                _Entry(name, digest, frozenset(clusters) if clusters is not None else None)
            )
        return cls(entries)

    def authenticate(self, authorization: str | None) -> Principal | None:
        """The principal for an ``Authorization`` header value, or None when it is not valid."""
        if not self._entries:
            return ANONYMOUS
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        presented = hashlib.sha256(token.strip().encode()).digest()
        found: _Entry | None = None
        for entry in self._entries:  # no early exit: every entry is compared
            if hmac.compare_digest(presented, entry.digest):
                found = entry
        return Principal(found.name, found.clusters) if found is not None else None
