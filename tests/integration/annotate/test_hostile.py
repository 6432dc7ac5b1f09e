"""Hostile writers on a real ``ingero annotate serve``: lines that once killed the server or
its node DB writer."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from ingero.annotate.codec import decode_refusal
from tests.integration.annotate.helpers import Server, annotate_server
from tests.integration.push.cluster import wait_for

pytestmark = pytest.mark.integration


def send(server: Server, *lines: bytes) -> list[str]:
    """The refusal reasons the server answered to ``lines``, sent on one connection."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(str(server.socket))
        s.sendall(b"".join(line + b"\n" for line in lines))
        s.shutdown(socket.SHUT_WR)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except ConnectionResetError:
            pass
    return [decode_refusal(line)[0] for line in out.splitlines()]


def steps(server: Server) -> list[int]:
    return [m["step"] for m in server.marks() if m["kind"] == "step"]


def test_a_huge_or_infinite_ts_is_refused_and_the_server_serves_on(tmp_path: Path) -> None:
    """A 400-digit integer ts once raised OverflowError out of the server (exit 70)."""
    with annotate_server(tmp_path) as server:
        refused = send(
            server,
            b'{"kind":"step","step":1,"ts":' + b"9" * 400 + b"}",
            b'{"kind":"step","step":1,"ts":-' + b"9" * 400 + b".5}",
            b'{"kind":"step","step":1,"ts":1e999}',
            b'{"kind":"label","name":"x","labels":{"n":' + b"9" * 30 + b"}}",
            b'{"kind":"step","step":1}',
        )
        assert server.proc.poll() is None, server.log.read_text()
        assert send(server, b'{"kind":"step","step":2}') == []
        log = server.stop()
    assert refused == ["bad_line"] * 4
    assert steps(server) == [1, 2]
    assert "refused 4 bad_line" in log


def test_a_lone_surrogate_is_refused_and_every_later_mark_is_written(tmp_path: Path) -> None:
    """JSON can spell a lone surrogate (\\ud800), which SQLite cannot store: accepted, it
    killed the node DB writer's thread and no later mark of any writer was written."""
    with annotate_server(tmp_path) as server:
        refused = send(
            server,
            b'{"kind":"label","name":"\\ud800"}',
            b'{"kind":"label","name":"x","labels":{"k":"a\\udfff"}}',
            b'{"kind":"label","name":"x","labels":{"\\ud83d":1}}',
            b'{"kind":"phase","name":"\\udc00x","state":"begin"}',
        )
        assert send(server, b'{"kind":"step","step":7}') == []
        wait_for(lambda: steps(server) == [7], 30, "a later mark in the node DB")
        log = server.stop()
    assert refused == ["bad_line"] * 4
    assert "refused 4 bad_line" in log
