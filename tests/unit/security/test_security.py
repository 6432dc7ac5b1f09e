"""The security core shared by Fleet and Echo: token files, the keyring's grace window,
rate limits, the audit counter and the gate, each driven by a manual clock."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from ingero.otlp.receiver import peer_host, retry_after_value
from ingero.runtime.clock import ManualClock
from ingero.runtime.errors import ConfigError
from ingero.security.access import RATE_LIMITED, SOURCE_RATE_LIMITED, Gate, Refusal, reload_material
from ingero.security.audit import ACCEPTED, OVERFLOW, REFUSED, AuditCounter, AuditKey, is_loopback
from ingero.security.bearer import (
    MAX_TOKEN_FILE_BYTES,
    MISSING,
    NOT_BEARER,
    RETIRED,
    UNKNOWN,
    Identity,
    Keyring,
    NamedToken,
    TokenFile,
    digest,
    load_token_files,
    read_token_file,
    token_id,
)
from ingero.security.ratelimit import RateLimitConfig, RateLimiter
from ingero.security.tls import ServerTls
from tests.integration.security import make_cert


@pytest.mark.parametrize(
    ("data", "token"),
    [
        (b"tok-1\n", "tok-1"),
        (b"tok-1\r\n", "tok-1"),  # CRLF, as written on Windows
        (b"\r\n\r\n  tok-1  \r\n\r\n", "tok-1"),  # blank lines and padding around it
        (b"# rotated 2026-01-01\ntok-1\n", "tok-1"),  # a comment line
        (b"tok-1", "tok-1"),  # no final newline
    ],
)
def test_token_file_forms_that_hold_one_token(tmp_path: Path, data: bytes, token: str) -> None:
    path = tmp_path / "t"
    path.write_bytes(data)
    assert read_token_file(str(path), "k") == token


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "holds no token"),
        (b"\n\r\n \t\n", "holds no token"),
        (b"# only a comment\n", "holds no token"),
        (b"tok-1\ntok-2\n", "holds 2 lines"),
        (b"\x00\x01junk\x02", "not visible ASCII"),
        (b"tok en\n", "not visible ASCII"),
        ("t\u00f6k\n".encode(), "not visible ASCII"),
        (b"\xff\xfe\x00", "not UTF-8"),
        (b"x" * (MAX_TOKEN_FILE_BYTES + 1), "over 65536 bytes"),
    ],
)
def test_token_file_junk_is_one_line_error(tmp_path: Path, data: bytes, message: str) -> None:
    path = tmp_path / "t"
    path.write_bytes(data)
    with pytest.raises(ConfigError, match=message) as info:
        read_token_file(str(path), "auth.token_files[0]")
    assert "\n" not in str(info.value) and str(info.value).startswith("auth.token_files[0]: ")


def test_huge_token_file_is_not_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "t"
    with path.open("wb") as f:  # sparse: 1 GiB on paper, nothing on disk
        f.truncate(1 << 30)
    with pytest.raises(ConfigError, match="not a token file"):
        read_token_file(str(path), "k")


def test_token_files_and_directory_are_named_by_file(tmp_path: Path) -> None:
    d = tmp_path / "tokens"
    d.mkdir()
    (d / "node-a").write_text("aaaa\n")
    (d / "node-b").write_text("bbbb\n")
    (d / ".node-c.swp").write_text("junk junk\n")  # editors' and hidden files are skipped
    (tmp_path / "single").write_text("ssss\n")
    tokens = load_token_files({"auth.token_file": str(tmp_path / "single")}, str(d))
    assert sorted(t.name for t in tokens) == ["node-a", "node-b", "single"]
    (d / "node-b").write_text("two\nlines\n")
    with pytest.raises(ConfigError, match="node-b: holds 2 lines"):
        load_token_files({}, str(d))
    with pytest.raises(ConfigError, match=r"auth\.token_dir: cannot read"):
        load_token_files({}, str(tmp_path / "missing"))


def keyring(clock: ManualClock, *tokens: str, grace: float = 60.0) -> Keyring[None]:
    return Keyring([NamedToken(f"n-{t}", digest(t), None) for t in tokens], grace, clock)


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (None, MISSING),
        ("", MISSING),
        ("Basic old", NOT_BEARER),
        ("Bearer ", NOT_BEARER),
        ("Bearer nope", UNKNOWN),
    ],
)
def test_keyring_refusal_reasons(header: str | None, reason: str) -> None:
    check = keyring(ManualClock(), "old").check(header)
    assert check.identity is None and check.reason == reason
    if reason == UNKNOWN:
        assert check.token_id == token_id(digest("nope"))


def test_replaced_token_is_valid_for_the_grace_window_then_retired() -> None:
    clock = ManualClock()
    ring = keyring(clock, "old", grace=60.0)
    assert ring.replace([NamedToken("n-new", digest("new"), None)]) == (1, 1)
    for header in ("Bearer old", "Bearer new"):
        identity = ring.check(header).identity
        assert identity is not None
    clock.advance(59.0)
    assert ring.check("Bearer old").identity is not None
    clock.advance(1.0)
    assert ring.check("Bearer old").reason == RETIRED
    assert ring.check("Bearer new").identity == Identity("n-new", token_id(digest("new")), None)
    # The next reload forgets expired ones (memory stays bounded by what is configured).
    assert ring.replace([NamedToken("n-new", digest("new"), None)]) == (1, 0)
    assert ring.check("Bearer old").reason == UNKNOWN


def test_a_token_accepted_before_a_replacement_is_retired_after_it() -> None:
    # Accepted values are remembered (no hash per request); a replacement forgets them.
    clock = ManualClock()
    ring = keyring(clock, "old", grace=60.0)
    for _ in range(2):
        assert ring.check("Bearer old").identity is not None
    ring.replace([NamedToken("n-new", digest("new"), None)])
    assert ring.check("Bearer old").identity is not None  # in its grace window
    clock.advance(60.0)
    assert ring.check("Bearer old").reason == RETIRED
    ring.replace([NamedToken("n-new", digest("new"), None)])
    assert ring.check("Bearer old").reason == UNKNOWN


def test_token_id_is_a_hash_prefix_never_the_token() -> None:
    tid = token_id(digest("s3cret-token"))
    assert len(tid) == 12 and "s3cret" not in tid
    assert tid == hashlib.sha256(b"s3cret-token").hexdigest()[:12]


def test_sender_token_file_rereads_on_change_and_keeps_old_on_failure(tmp_path: Path) -> None:
    path = tmp_path / "t"
    path.write_text("one\n")
    source = TokenFile(str(path), "auth_token_file")
    assert source() == "one"
    path.write_text("two-longer\n")
    assert source() == "two-longer"
    path.write_text("bad token\n")  # an operator's typo: the node keeps sending the old one
    assert source() == "two-longer"


def test_rate_limiter_refills_and_forgets_least_recent_keys() -> None:
    clock = ManualClock()
    limiter = RateLimiter(rate=2.0, burst=2, max_keys=3, clock=clock)
    assert [limiter.take("a") for _ in range(3)] == [0.0, 0.0, 0.5]
    clock.advance(0.5)
    assert limiter.take("a") == 0.0
    for key in ("b", "c", "d"):
        limiter.take(key)
    assert len(limiter) == 3  # "a" was the least recently used: forgotten
    assert RateLimiter(0.0, 1, 1, clock).take("x") == 0.0  # rate 0: no limit


def test_audit_counter_aggregates_per_window_and_caps_keys() -> None:
    clock = ManualClock()
    counter = AuditCounter("fleet", max_keys=2, clock=clock)
    ok = AuditKey("otlp-http", ACCEPTED, "node-a", "0123456789ab")
    for _ in range(1000):
        counter.record(ok)
    for i in range(50):  # a flood from made-up addresses
        counter.record(AuditKey("otlp-http", REFUSED, "", "", UNKNOWN, f"10.0.0.{i}"))
    clock.advance(1.0)
    entries = counter.take()
    assert len(entries) == 3
    by_outcome = {(e["INGERO_OUTCOME"], e.get("INGERO_SOURCE", "")): e for e in entries}
    assert by_outcome[(ACCEPTED, "")]["INGERO_COUNT"] == "1000"
    assert by_outcome[(ACCEPTED, "")]["INGERO_TOKEN_ID"] == "0123456789ab"
    assert by_outcome[(REFUSED, "10.0.0.0")]["INGERO_COUNT"] == "1"
    assert by_outcome[(REFUSED, OVERFLOW)]["INGERO_COUNT"] == "49"
    assert {e["PRIORITY"] for e in entries} == {"6", "4"}
    assert counter.take() == []  # an idle window writes nothing


def test_gate_outcomes() -> None:
    clock = ManualClock()
    ring = keyring(clock, "good")
    limits = RateLimitConfig(per_token=1.0, token_burst=2, refusals_per_source=1.0, refusal_burst=1)
    gate = Gate(ring, None, limits, clock=clock)
    assert isinstance(gate.admit("api", "Bearer good", "1.2.3.4", "no"), Identity)
    assert isinstance(gate.admit("api", "Bearer good", "1.2.3.4", "no"), Identity)
    limited = gate.admit("api", "Bearer good", "1.2.3.4", "no")
    assert isinstance(limited, Refusal) and limited.status == 429
    assert limited.reason == RATE_LIMITED and limited.retry_after == pytest.approx(1.0)
    first = gate.admit("api", "Bearer bad", "6.6.6.6", "no token")
    assert first == Refusal(401, UNKNOWN, "no token")
    second = gate.admit("api", "Bearer bad", "6.6.6.6", "no token")
    assert isinstance(second, Refusal) and second.reason == SOURCE_RATE_LIMITED
    # another address is not held back by the first one's refusals
    assert gate.admit("api", None, "7.7.7.7", "no token") == Refusal(401, MISSING, "no token")
    off = Gate(Keyring([]), "payload", limits)
    assert off.admit("api", None, "x", "no") == Identity("", "", "payload")


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0.01, "1"), (1.0, "1"), (1.2, "2"), (30.0, "30")],
)
def test_retry_after_is_whole_seconds_at_least_one(value: float, expected: str) -> None:
    assert retry_after_value(value) == expected


@pytest.mark.parametrize(
    ("peer", "host"),
    [("ipv4:127.0.0.1:5555", "127.0.0.1"), ("ipv6:[::1]:5555", "::1"), ("unix:/tmp/s", "/tmp/s")],
)
def test_grpc_peer_host(peer: str, host: str) -> None:
    assert peer_host(peer) == host


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("", False),
        ("10.1.2.3", False),
        ("fleet.example", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_reload_keeps_what_was_loaded_when_it_fails(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ring = keyring(ManualClock(), "old")
    good = [NamedToken("n-new", digest("new"), None)]

    def broken() -> list[NamedToken[None]]:
        raise ConfigError("auth.token_dir: /x: holds 2 lines; a token file holds one token")

    caplog.set_level("INFO")
    assert not reload_material("fleet", ring, broken, None)
    assert not reload_material("fleet", ring, list, None)  # no token left: refused
    assert ring.names() == ["n-old"]
    failures = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert failures == [
        "fleet: token reload failed, keeping the tokens loaded before: "
        "auth.token_dir: /x: holds 2 lines; a token file holds one token",
        "fleet: token reload failed, keeping the tokens loaded before: "
        "no token left; a reload cannot turn authentication off",
    ]
    assert reload_material("fleet", ring, lambda: good, None)
    assert ring.names() == ["n-new"]


def test_server_tls_reload_swaps_or_keeps_the_pair(tmp_path: Path) -> None:
    cert, key = make_cert(tmp_path)
    tls = ServerTls(str(cert), str(key))
    context = tls.ssl_context()
    assert tls.ssl_context() is context  # one front context; handshakes pick the current
    credentials = tls.grpc_credentials()
    assert credentials is not None
    first = tls._current
    tls.reload()
    assert tls._current is not first
    second = tls._current
    cert.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=r"auth\.tls_cert/tls_key: cannot load"):
        tls.reload()
    assert tls._current is second
