"""Echo's security surface against the real daemon: the tokens file and the certificate
rotated on SIGHUP while events are sent continuously (no send fails), the old token refused
after the grace window, and a token over its rate answered 429 with Retry-After."""

from __future__ import annotations

import hashlib
import json
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ingero.otlp.exporter import ExportError, HttpExporter
from ingero.otlp.logs import encode_events
from ingero.security.audit import AUDIT_MESSAGE_ID
from ingero.security.bearer import TokenFile
from ingero.security.tls import client_ssl_context
from tests.integration.fleet.helpers import wait_for
from tests.integration.journald_harness import run_with_journald, unavailable
from tests.integration.security import BackToBack, RotationCerts, refuses_token, replace

from .helpers import TOKEN_OPS, EchoProcess, http, straggler

pytestmark = pytest.mark.integration

OLD, NEW = "fleet-old-0123456789abcdef", "fleet-new-0123456789abcdef"


def tokens_yaml(*tokens: tuple[str, str]) -> bytes:
    entries = [{"name": "ops", "token": TOKEN_OPS}]
    entries += [{"name": name, "token": token} for name, token in tokens]
    return json.dumps({"tokens": entries}).encode()


def events_sender(endpoint: str, token: TokenFile, ca: Path) -> BackToBack:
    """Events to Echo's OTLP/HTTP over TLS, back to back, with the token file's token."""
    exporter = HttpExporter(endpoint, token, 10.0, client_ssl_context(str(ca)), "echo")

    def send(i: int) -> str | None:
        try:
            exporter.send(encode_events([straggler(f"n{i}", "A", float(i))]))
        except ExportError as exc:
            return str(exc)
        return None

    return BackToBack(send)


def test_rotation_under_load_fails_no_send(tmp_path: Path) -> None:
    certs = RotationCerts(tmp_path)
    ca, cert, key = certs.ca, certs.cert, certs.key
    tokens = tmp_path / "echo-tokens.yaml"
    replace(tokens, tokens_yaml(("fleet-old", OLD)))
    sender_token = tmp_path / "sender-token"
    sender_token.write_text(OLD + "\n")
    grace = 2.0
    echo = EchoProcess(
        tmp_path,
        tls=(cert, key),
        auth={"token_table": str(tokens), "token_grace": f"{grace}s"},
    ).start()
    assert echo.proc is not None
    proc = echo.proc
    sender = events_sender(
        f"https://localhost:{echo.otlp_http.rpartition(':')[2]}",
        TokenFile(str(sender_token), "token"),
        ca,
    )
    try:
        assert certs.served(echo.otlp_http) == certs.a[0]
        sender.start()
        wait_for(lambda: sender.ok > 10, what="sends before the rotation")
        replace(tokens, tokens_yaml(("fleet-old", OLD), ("fleet-new", NEW)))
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: echo.log().count("reloaded the TLS certificate") >= 1)
        replace(sender_token, (NEW + "\n").encode())
        replace(tokens, tokens_yaml(("fleet-new", NEW)))
        certs.use(certs.b)
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: echo.log().count("reloaded the TLS certificate") >= 2)
        assert certs.served(echo.otlp_http) == certs.b[0]
        assert certs.served(echo.api) == certs.b[0]
        # a tokens file that does not parse keeps the tokens loaded before
        replace(tokens, b"tokens: [\n")
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "token reload failed" in echo.log(), what="the failed reload's line")
        old = HttpExporter(
            f"https://localhost:{echo.otlp_http.rpartition(':')[2]}",
            OLD,
            10.0,
            client_ssl_context(str(ca)),
            "echo",
        )
        wait_for(lambda: refuses_token(old), timeout=grace + 30, what="the old token refused")
        mark = sender.ok
        wait_for(lambda: sender.ok > mark + 10, what="sends after the grace window")
    finally:
        sender.stop()
        echo.stop()
    assert sender.failures == []


def test_token_over_its_rate_gets_429_with_retry_after(tmp_path: Path) -> None:
    echo = EchoProcess(tmp_path, auth={"rate_limit": {"per_token": 0.5, "token_burst": 2}}).start()
    try:
        url = f"{echo.url}/api/v1/sql"
        body = json.dumps({"query": "SELECT 1"}).encode()
        statuses = [http("POST", url, body, TOKEN_OPS)[0] for _ in range(3)]
        assert statuses == [200, 200, 429]
        request = urllib.request.Request(url, body, method="POST")
        request.add_header("Authorization", f"Bearer {TOKEN_OPS}")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=30)
        assert info.value.code == 429 and info.value.headers["Retry-After"] == "2"
        assert "rate limit" in json.loads(info.value.read())["error"]
        wait_for(lambda: http("POST", url, body, TOKEN_OPS)[0] == 200, what="a refilled bucket")
    finally:
        echo.stop()


def test_open_listener_without_tokens_warns_once(tmp_path: Path) -> None:
    echo = EchoProcess(tmp_path, tokens=False)
    config = json.loads((tmp_path / "echo.yaml").read_text())
    config["listen"]["otlp_grpc"] = "0.0.0.0:" + echo.otlp_grpc.rpartition(":")[2]
    (tmp_path / "echo.yaml").write_text(json.dumps(config))
    echo.start()
    try:
        wait_for(lambda: "echo ready" in echo.log(), what="the ready line")
        lines = [line for line in echo.log().splitlines() if "no bearer token" in line]
        assert len(lines) == 1 and "otlp_grpc 0.0.0." in lines[0]
        assert "api 127.0.0.1" not in lines[0]  # loopback listeners are not named
    finally:
        echo.stop()


AUDIT_SCRIPT = r"""
import json, sys
from pathlib import Path
from tests.integration.echo.helpers import TOKEN_OPS, EchoProcess, http
echo = EchoProcess(Path(sys.argv[1])).start()
url, body = echo.url + "/api/v1/sql", json.dumps({"query": "SELECT 1"}).encode()
statuses = [http("POST", url, body, TOKEN_OPS)[0] for _ in range(20)]
statuses += [http("POST", url, body, "wrong-token-guess")[0] for _ in range(2)]
assert echo.stop() == 0
assert statuses == [200] * 20 + [401] * 2, statuses
"""


def test_audit_entries_in_journald(tmp_path: Path) -> None:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    script = tmp_path / "run.py"
    script.write_text(AUDIT_SCRIPT)
    root = Path(__file__).resolve().parents[3]
    command = (
        f"cd {root} && PYTHONPATH={root} {sys.executable} {script} {tmp_path} || exit 1; "
        "journalctl --sync 2>/dev/null; "
        f"journalctl -o json --all --no-pager MESSAGE_ID={AUDIT_MESSAGE_ID}"
    )
    result = run_with_journald(["bash", "-c", command], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert TOKEN_OPS not in result.stdout
    entries = [json.loads(line) for line in result.stdout.splitlines()]
    assert {e["INGERO_DAEMON"] for e in entries} == {"echo"}
    accepted = [e for e in entries if e["INGERO_OUTCOME"] == "accepted"]
    assert sum(int(e["INGERO_COUNT"]) for e in accepted) == 20
    assert {(e["INGERO_LISTENER"], e["INGERO_TOKEN_NAME"]) for e in accepted} == {("api", "ops")}
    assert {e["INGERO_TOKEN_ID"] for e in accepted} == {
        hashlib.sha256(TOKEN_OPS.encode()).hexdigest()[:12]
    }
    refused = [e for e in entries if e["INGERO_OUTCOME"] == "refused"]
    assert sum(int(e["INGERO_COUNT"]) for e in refused) == 2
    assert {(e["INGERO_REASON"], e["INGERO_SOURCE"]) for e in refused} == {
        ("unknown_token", "127.0.0.1")
    }
