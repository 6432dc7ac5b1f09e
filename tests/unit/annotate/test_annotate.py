"""The annotate line codec (fuzzed) and the server's pure core: bounds, refusals, rows."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingero.annotate.client import Annotator
from ingero.annotate.codec import (
    DEFAULT_LIMITS,
    LineError,
    Mark,
    decode_line,
    decode_refusal,
    encode_mark,
    encode_refusal,
)
from ingero.annotate.server import Annotations, ServerLimits, TokenBucket, Writer
from ingero.runtime.clock import ManualClock

short = st.text(min_size=1, max_size=16)
values = st.one_of(
    st.text(max_size=32),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
)
labels = st.dictionaries(short, values, max_size=DEFAULT_LIMITS.max_labels)
marks = st.one_of(
    st.builds(
        Mark,
        kind=st.just("step"),
        name=st.just("step"),
        step=st.none() | st.integers(min_value=0, max_value=2**62),
        labels=labels,
        ts=st.none() | st.floats(min_value=0, max_value=4e9),
    ),
    st.builds(
        Mark,
        kind=st.just("phase"),
        name=short,
        state=st.sampled_from(["begin", "end"]),
        labels=labels,
    ),
    st.builds(Mark, kind=st.just("label"), name=short, labels=labels),
)


@settings(deadline=None)  # a shared, loaded machine: no per-example deadline
@given(marks)
def test_decode_returns_what_encode_wrote(mark: Mark) -> None:
    line = encode_mark(mark)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode_line(line) == mark


@settings(deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_decode_to_a_mark_or_one_line_error(data: bytes) -> None:
    try:
        decode_line(data)
    except LineError as exc:
        assert "\n" not in str(exc)


@settings(deadline=None)
@given(st.text(max_size=40), st.text(max_size=80))
def test_refusal_round_trip(reason: str, detail: str) -> None:
    line = encode_refusal(reason, detail)
    assert line.count(b"\n") == 1
    assert decode_refusal(line) == (reason, detail)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"x" * 5000, "too_long"),
        (b"not json", "bad_json"),
        (b"[1]", "bad_json"),
        (b'{"kind":"step","step":NaN}', "bad_json"),
        (b'{"kind":"nope"}', "bad_line"),
        (b'{"kind":"step","pid":1}', "bad_line"),
        (b'{"kind":"step","step":-1}', "bad_line"),
        (b'{"kind":"phase","name":"x"}', "bad_line"),
        (b'{"kind":"label","name":"x","labels":{"a":[1]}}', "bad_line"),
        (b'{"kind":"label","name":"' + b"n" * 65 + b'"}', "too_big"),
        (b'{"kind":"label","name":"x","labels":{"a":"' + b"v" * 257 + b'"}}', "too_big"),
        (b'{"kind":"label","name":"x","labels":{"' + b"k" * 65 + b'":1}}', "too_big"),
    ],
)
def test_lines_refused_with_their_reason(line: bytes, reason: str) -> None:
    with pytest.raises(LineError) as caught:
        decode_line(line)
    assert caught.value.reason == reason


def test_too_many_labels() -> None:
    body = {"kind": "label", "name": "x", "labels": {f"k{i}": i for i in range(17)}}
    with pytest.raises(LineError) as caught:
        decode_line(json.dumps(body).encode())
    assert caught.value.reason == "too_many_labels"


def test_token_bucket_refills_at_its_rate() -> None:
    bucket = TokenBucket(rate=2.0, burst=3, now=0.0)
    assert [bucket.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.take(0.5) and not bucket.take(0.5)  # half a second: one line


def core(**limits: object) -> tuple[Annotations, ManualClock]:
    clock = ManualClock()
    return Annotations(clock, ServerLimits(**limits)), clock  # type: ignore[arg-type]


def refusals(c: Annotations, conn: int) -> list[str]:
    return [decode_refusal(line)[0] for line in c.replies(conn).splitlines()]


def test_marks_rows_phase_pairs_and_step_rows() -> None:
    c, clock = core()
    assert c.open(1, Writer(pid=42, uid=1000, job_id="7", rank=3))
    c.feed(1, b'{"kind":"phase","name":"checkpoint","state":"begin"}\n{"kind":"st')
    c.feed(1, b'ep","step":1}\n{"kind":"step","step":2}\n')
    first = c.take()
    clock.advance(2.0)
    c.feed(1, b'{"kind":"phase","name":"checkpoint","state":"end"}\n')
    second = c.take()
    assert refusals(c, 1) == []
    assert [(m["kind"], m["step"], m["pid"], m["rank"]) for m in first.marks] == [
        ("phase", None, 42, 3),
        ("step", 1, 42, 3),
        ("step", 2, 42, 3),
    ]
    assert first.marks[0]["ts_end"] is None  # still open when written
    assert [(s["pid"], s["op"], s["count"], s["job_id"]) for s in first.steps] == [
        (42, "step", 2, "7")
    ]
    assert second.marks == [] and second.steps == []
    assert second.mark_ends == [
        {"pid": 42, "name": "checkpoint", "ts_start": clock.now() - 2.0, "ts_end": clock.now()}
    ]


def test_a_phase_closed_before_the_flush_is_one_row() -> None:
    c, clock = core()
    c.open(1, Writer(5, 0))
    c.feed(1, b'{"kind":"phase","name":"eval","state":"begin"}\n')
    clock.advance(1.0)
    c.feed(1, b'{"kind":"phase","name":"eval","state":"end"}\n')
    take = c.take()
    assert take.mark_ends == []
    assert [(m["ts_start"], m["ts_end"]) for m in take.marks] == [(clock.now() - 1.0, clock.now())]


def test_every_refusal_is_answered_and_counted() -> None:
    c, _ = core(max_open_phases=1)
    c.open(1, Writer(5, 0))
    lines = [
        b"nope",
        b'{"kind":"phase","name":"a","state":"end"}',
        b'{"kind":"phase","name":"a","state":"begin"}',
        b'{"kind":"phase","name":"a","state":"begin"}',
        b'{"kind":"phase","name":"b","state":"begin"}',
        b'{"kind":"step","ts":1.0}',
    ]
    c.feed(1, b"\n".join(lines) + b"\n")
    assert refusals(c, 1) == ["bad_json", "phase", "phase", "phase", "clock"]
    assert c.refused == {"bad_json": 1, "phase": 3, "clock": 1}
    assert c.accepted == 1


def test_a_long_line_is_refused_once_and_skipped_to_its_end() -> None:
    c, _ = core()
    c.open(1, Writer(5, 0))
    for _ in range(10):
        c.feed(1, b"x" * 1000)  # no newline: the buffer never holds more than one line
    c.feed(1, b'xx\n{"kind":"step"}\n')
    assert refusals(c, 1) == ["too_long"]
    assert [m["kind"] for m in c.take().marks] == ["step"]


def test_rate_per_writer_not_per_connection() -> None:
    c, clock = core(lines_per_s=1.0, burst=2)
    c.open(1, Writer(5, 0))
    c.open(2, Writer(5, 0))  # the same process on a second connection shares its bucket
    c.feed(1, b'{"kind":"step"}\n{"kind":"step"}\n')
    c.feed(2, b'{"kind":"step"}\n')
    assert refusals(c, 1) == [] and refusals(c, 2) == ["rate"]
    clock.advance(1.0)
    c.feed(2, b'{"kind":"step"}\n')
    assert refusals(c, 2) == []
    assert c.take().steps[0]["count"] == 3


def test_a_recycled_pid_is_a_new_writer() -> None:
    """The same pid, started again (a new process on a recycled pid): it has a bucket of
    its own and cannot end the phase its predecessor left open; the predecessor's rows
    and its step count stay its own."""
    c, _ = core(lines_per_s=1.0, burst=2)
    old, new = Writer(5, 0, started=100), Writer(5, 0, started=900)
    c.open(1, old)
    c.feed(1, b'{"kind":"phase","name":"ckpt","state":"begin"}\n{"kind":"step"}\n')
    c.close(1)
    c.open(2, new)
    c.feed(2, b'{"kind":"phase","name":"ckpt","state":"end"}\n{"kind":"step"}\n')
    assert refusals(c, 2) == ["phase"]  # not "rate": the old process's bucket is spent
    take = c.take()
    assert [(m["kind"], m["ts_end"]) for m in take.marks] == [
        ("phase", None),
        ("step", None),
        ("step", None),
    ]
    assert take.mark_ends == []
    assert sorted(s["count"] for s in take.steps) == [1, 1] and c.writers == 2


def test_clients_bounded_and_writers_forgotten() -> None:
    c, _ = core(max_clients=1)
    assert c.open(1, Writer(5, 0))
    assert not c.open(2, Writer(6, 0))
    assert c.refused == {"clients": 1}
    c.close(1)
    assert c.open(3, Writer(6, 0)) and c.clients == 1


def test_replies_bounded_for_a_client_that_never_reads() -> None:
    c, _ = core(lines_per_s=1e9, burst=10**6, uid_lines_per_s=1e9, uid_burst=10**6)
    c.open(1, Writer(5, 0))
    c.feed(1, b"bad\n" * 5000)
    assert len(c.replies(1)) <= 16 * 1024
    assert c.refused["bad_json"] == 5000 and c.replies_dropped > 0


def test_the_client_waits_before_connecting_again(tmp_path: Path) -> None:
    path = tmp_path / "a.sock"
    patient = Annotator(path, reconnect_s=3600.0)
    eager = Annotator(path, reconnect_s=0.0)
    patient.step(1)
    eager.step(1)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen()
        patient.step(2)  # within its wait: dropped, no connect
        eager.step(2)
        assert (patient.sent, patient.dropped) == (0, 2)
        assert (eager.sent, eager.dropped) == (1, 1)
        conn, _ = server.accept()
        with conn:
            assert conn.recv(100) == b'{"kind":"step","step":2}\n'
    patient.close()
    eager.close()


def test_the_client_imports_only_the_standard_library() -> None:
    """A training job imports the client without ingero's dependencies."""
    code = (
        "import sys; before = set(sys.modules); import ingero.annotate.client\n"
        "tops = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(sorted(tops - set(sys.stdlib_module_names) - {'ingero'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.strip() == "[]"
