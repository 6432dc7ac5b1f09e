"""The shared TLS and bearer-token helpers: each failure is one ConfigError naming the setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingero.runtime.errors import ConfigError
from ingero.security.bearer import Keyring, NamedToken, authorization, digest, read_token_file
from ingero.security.tls import (
    check_pair,
    client_ssl_context,
    grpc_server_credentials,
    server_ssl_context,
)


def test_token_file_read_stripped_and_presented(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("s3cret\n")
    token = read_token_file(str(path), "auth.token_file")
    assert token == "s3cret"
    keyring = Keyring([NamedToken("t", digest(token), None)])
    assert keyring.check(authorization("s3cret")).identity is not None


def test_a_token_file_that_cannot_be_read_is_one_line_naming_the_setting(
    tmp_path: Path,
) -> None:
    # the junk a readable file may hold: test_security.test_token_file_junk_is_one_line_error
    with pytest.raises(ConfigError, match="auth_token_file: cannot read") as info:
        read_token_file(str(tmp_path / "missing"), "auth_token_file")
    assert "\n" not in str(info.value)


def test_a_certificate_needs_its_key() -> None:
    check_pair(None, None)
    check_pair("c.pem", "k.pem")
    with pytest.raises(ValueError, match=r"auth\.tls_cert and auth\.tls_key must be set together"):
        check_pair("c.pem", None)


def test_no_certificate_means_no_tls() -> None:
    assert server_ssl_context(None, None) is None
    assert grpc_server_credentials(None, None) is None
    assert client_ssl_context(None) is None


def test_unloadable_material_names_the_setting(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=r"auth\.tls_cert/tls_key: cannot load"):
        server_ssl_context(str(junk), str(junk))
    with pytest.raises(ConfigError, match=r"auth\.tls_key: cannot read"):
        grpc_server_credentials(str(junk), str(tmp_path / "missing.pem"))
    with pytest.raises(ConfigError, match="ca_file: cannot load"):
        client_ssl_context(str(junk))
