"""The client against a real ``ingero annotate serve`` when things go wrong for the job: a
server that stopped accepting (its listen backlog full) and the values a training loop
passes (NumPy scalars, bytes, fractions). Documented: it never blocks the step and never
raises into the job."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from ingero.annotate.client import Annotator
from tests.integration.annotate.helpers import annotate_server
from tests.integration.push.cluster import wait_for

pytestmark = pytest.mark.integration


def fill_backlog(path: Path) -> list[socket.socket]:
    """Connections the server has not accepted, until its backlog takes no more."""
    held = []
    while len(held) < 4096:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(str(path))
        except BlockingIOError:  # EAGAIN: the backlog is full
            s.close()
            return held
        held.append(s)
    raise AssertionError("the backlog never filled")


def test_a_step_never_blocks_on_a_server_that_stopped_accepting(tmp_path: Path) -> None:
    """connect() blocked in the training step while the server's listen backlog was full
    (a stopped or frozen server): the step waited as long as the server did."""
    with annotate_server(tmp_path) as server:
        server.proc.send_signal(signal.SIGSTOP)
        held: list[socket.socket] = []
        try:
            held = fill_backlog(server.socket)
            marks = Annotator(server.socket, reconnect_s=0.0)
            done = threading.Event()

            def step() -> None:
                for i in range(3):
                    marks.step(i)
                done.set()

            worker = threading.Thread(target=step, daemon=True)
            worker.start()
            # generous: a non-blocking connect fails at once; a blocking one never returns
            worker.join(timeout=30)
            assert done.is_set(), "the step blocked in connect()"
            assert (marks.sent, marks.dropped) == (0, 3)
        finally:
            server.proc.send_signal(signal.SIGCONT)
            for s in held:
                s.close()

        # the server is back (turning away the backlog's connections first): a later mark
        # connects and lands
        def landed() -> bool:
            marks.step(9)
            return any(m["step"] == 9 for m in server.marks())

        wait_for(landed, 30, "a mark in the node DB again")
        marks.close()
        server.stop()
    assert {m["step"] for m in server.marks()} == {9}


def test_numpy_scalars_bytes_and_fractions_are_marked_not_raised(tmp_path: Path) -> None:
    """step(np.int64(3)), a np.float32 label, bytes or a Fraction raised TypeError into the
    training loop (json could not serialise them)."""
    with annotate_server(tmp_path) as server:
        marks = Annotator(server.socket)
        marks.step(np.int64(3))
        marks.step(np.float32(4.0))  # a whole float is a step number
        marks.step(2.5)  # not one: the step is marked without a number
        with marks.span(b"checkpoint", {"path": b"/ckpt/\xff7"}):
            marks.label(
                "train",
                {
                    "loss": np.float32(0.25),
                    "lr": Fraction(1, 4),
                    "epoch": np.int32(2),
                    "warm": np.bool_(True),
                    "shape": np.array([2, 3]),
                    "nan": float("nan"),
                },
            )
        marks.close()
        wait_for(lambda: len(server.marks()) == 5, 30, "five marks in the node DB")
        server.stop()
    rows = server.marks()
    assert [(m["kind"], m["name"], m["step"]) for m in rows] == [
        ("step", "step", 3),
        ("step", "step", 4),
        ("step", "step", None),
        ("phase", "checkpoint", None),
        ("label", "train", None),
    ]
    assert json.loads(rows[3]["labels"]) == {"path": "/ckpt/\ufffd7"}
    assert json.loads(rows[4]["labels"]) == {
        "loss": 0.25,
        "lr": 0.25,
        "epoch": 2,
        "warm": True,
        "shape": "[2 3]",
        "nan": "nan",
    }
    assert rows[3]["ts_end"] is not None


def test_a_connection_the_server_closed_idle_costs_no_mark(tmp_path: Path) -> None:
    """The server closes a silent connection: the next mark connects again at once."""
    with annotate_server(tmp_path, "--idle-s", "0.3") as server:
        marks = Annotator(server.socket)
        marks.step(1)
        wait_for(lambda: len(server.marks()) == 1, 30, "the first mark in the node DB")
        time.sleep(1.0)  # well past --idle-s: the server has closed the connection
        marks.step(2)  # its send meets the closed connection (EPIPE), not the server's answer
        marks.close()
        wait_for(lambda: len(server.marks()) == 2, 30, "both marks in the node DB")
        server.stop()
    assert [m["step"] for m in server.marks()] == [1, 2]
    assert marks.dropped == 0
