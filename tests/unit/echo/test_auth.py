"""Echo bearer tokens: parsing, scoping, and refusal of bad token files."""

from __future__ import annotations

import hashlib

import pytest

from ingero.echo.auth import ANONYMOUS, AccessDenied, Principal, TokenTable
from ingero.runtime.errors import ConfigError

TOKEN_A = "token-for-tenant-a-0123456789"
TOKEN_ALL = "token-for-the-operator-0123456789"


def table() -> TokenTable:
    return TokenTable.parse(
        {
            "tokens": [
                {"name": "tenant-a", "token": TOKEN_A, "clusters": ["A"]},
                {"name": "ops", "sha256": hashlib.sha256(TOKEN_ALL.encode()).hexdigest()},
            ]
        },
        "tokens.yaml",
    )


def test_scoped_and_unscoped_tokens_resolve_to_their_principals() -> None:
    t = table()
    a = t.authenticate(f"Bearer {TOKEN_A}")
    assert a == Principal("tenant-a", frozenset({"A"}))
    assert a is not None and a.allows("A") and not a.allows("B")
    ops = t.authenticate(f"bearer {TOKEN_ALL}")
    assert ops == Principal("ops", None)
    assert ops is not None and ops.allows("anything")


@pytest.mark.parametrize(
    "header",
    [None, "", "Bearer", "Bearer ", f"Basic {TOKEN_A}", f"Bearer {TOKEN_A}x", "Bearer nope"],
)
def test_invalid_headers_are_refused(header: str | None) -> None:
    assert table().authenticate(header) is None


def test_no_tokens_file_means_anonymous_with_every_cluster() -> None:
    t = TokenTable.load(None)
    assert not t.enabled
    assert t.authenticate(None) is ANONYMOUS


def test_require_refuses_a_cluster_outside_the_scope() -> None:
    p = Principal("tenant-a", frozenset({"A"}))
    p.require("A")
    p.require(None)
    with pytest.raises(AccessDenied, match="'B'"):
        p.require("B")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({}, "non-empty list"),
        ({"tokens": [{"token": TOKEN_A}]}, "'name'"),
        ({"tokens": [{"name": "x", "token": "short"}]}, "16\\+ characters"),
        ({"tokens": [{"name": "x"}]}, "exactly one"),
        ({"tokens": [{"name": "x", "token": TOKEN_A, "sha256": "ab"}]}, "exactly one"),
        ({"tokens": [{"name": "x", "sha256": "zz"}]}, "64 hex"),
        ({"tokens": [{"name": "x", "token": TOKEN_A, "clusters": "A"}]}, "list of cluster"),
        ({"tokens": [{"name": "x", "token": TOKEN_A, "role": "admin"}]}, "unknown key 'role'"),
    ],
)
def test_bad_tokens_files_are_config_errors(raw: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TokenTable.parse(raw, "tokens.yaml")


def test_the_raw_token_never_appears_in_a_principal() -> None:
    p = table().authenticate(f"Bearer {TOKEN_A}")
    assert TOKEN_A not in repr(p)
