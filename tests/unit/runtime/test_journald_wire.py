"""journald native protocol: what we write parses back, over a real datagram socket too."""

from __future__ import annotations

import array
import os
import socket
import struct
from pathlib import Path

import pytest

from ingero.push.channels.journald import JournaldChannel, encode_fields
from ingero.schema.events import MESSAGE_IDS, Event


def parse_native(data: bytes) -> dict[str, str]:
    """The receiving side of the protocol (as journald parses it), strict."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        nl = data.index(b"\n", pos)
        line = data[pos:nl]
        if b"=" in line:
            name, _, value = line.partition(b"=")
            pos = nl + 1
        else:
            name = line
            (size,) = struct.unpack("<Q", data[nl + 1 : nl + 9])
            value = data[nl + 9 : nl + 9 + size]
            assert data[nl + 9 + size : nl + 10 + size] == b"\n"
            pos = nl + 10 + size
        out[name.decode()] = value.decode()
    return out


def event(**extra: object) -> Event:
    return Event(
        type="straggler_state",
        node_id="gpu-01",
        cluster_id="c1",
        timestamp=1.5,
        job_id="42",
        rank=3,
        score=0.41,
        threshold=0.7,
        detection_mode="fleet",
        extra=dict(extra),
    )


def test_round_trip_simple_and_binary_safe_fields() -> None:
    fields = {"MESSAGE": "one\ntwo", "A": "x=y", "EMPTY": "", "UNI": "naïve ✓"}
    assert parse_native(encode_fields(fields)) == fields
    assert b"A=x=y\n" in encode_fields(fields)
    assert encode_fields({"M": "a\nb"}) == b"M\n" + struct.pack("<Q", 3) + b"a\nb\n"


@pytest.mark.parametrize("name", ["lower", "_TRUSTED", "WITH-DASH", "", "A" * 65])
def test_invalid_field_names_rejected(name: str) -> None:
    with pytest.raises(ValueError):
        encode_fields({name: "x"})


def test_event_fields_on_the_wire() -> None:
    got = parse_native(encode_fields(event(reason="a\nb").journal_fields()))
    assert got["MESSAGE_ID"] == MESSAGE_IDS["straggler_state"]
    assert got["INGERO_EVENT"] == "straggler_state"
    assert (got["INGERO_NODE"], got["INGERO_CLUSTER"], got["INGERO_JOB"]) == ("gpu-01", "c1", "42")
    assert got["INGERO_REASON"] == "a\nb"
    assert got["PRIORITY"] == "4"


def receiver(tmp_path: Path) -> tuple[socket.socket, str]:
    path = str(tmp_path / "journal.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    return sock, path


def test_datagram_sent_to_socket(tmp_path: Path) -> None:
    sock, path = receiver(tmp_path)
    channel = JournaldChannel(path)
    try:
        ev = event()
        channel.send(ev)
        got = parse_native(sock.recv(65536))
        assert got["INGERO_EVENT_ID"] == ev.event_id
        assert channel.stats() == {"sent": 1, "dropped": 0, "errors": 0}
    finally:
        channel.close()
        sock.close()


def test_large_entry_goes_through_a_sealed_memfd(tmp_path: Path) -> None:
    sock, path = receiver(tmp_path)
    channel = JournaldChannel(path)
    try:
        big = "x" * (4 * 1024 * 1024)  # larger than any datagram the kernel accepts
        channel.send(event(detail=big))
        fds = array.array("i")
        msg, anc, _flags, _addr = sock.recvmsg(16, socket.CMSG_SPACE(fds.itemsize))
        assert msg == b""
        level, kind, data = anc[0]
        assert (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS)
        fd = struct.unpack("i", data[: fds.itemsize])[0]
        try:
            payload = os.pread(fd, 8 * 1024 * 1024, 0)
        finally:
            os.close(fd)
        assert parse_native(payload)["INGERO_DETAIL"] == big
        assert channel.stats()["sent"] == 1
    finally:
        channel.close()
        sock.close()


def test_absent_journald_is_counted_not_raised(tmp_path: Path) -> None:
    channel = JournaldChannel(str(tmp_path / "nobody.sock"))
    channel.send(event())
    channel.close()
    assert channel.stats() == {"sent": 0, "dropped": 0, "errors": 1}


def test_full_socket_buffer_is_a_drop_not_a_wait(tmp_path: Path) -> None:
    sock, path = receiver(tmp_path)  # never reads
    channel = JournaldChannel(path)
    try:
        for _ in range(5000):
            channel.send(event())
        stats = channel.stats()
        assert stats["dropped"] > 0
        assert stats["sent"] + stats["dropped"] == 5000
    finally:
        channel.close()
        sock.close()
