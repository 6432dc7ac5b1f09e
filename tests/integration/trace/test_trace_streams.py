"""Per-stream syncs, launches and steps, under the real tracer (stand-in libcudart/libcuda).

``stream_engine.c`` steps a decode stream through the runtime (launches with two ``dim3``
passed by value, then a stream sync), one step in ten a long prefill step on the same
stream, and a second stream through the driver (the stream in cuLaunchKernel's 9th
argument, on the stack). The node DB's ``stream_intervals`` holds both streams with the
counts the process made, and fleet-push's split of the decode stream's step times finds
its prefill steps.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from ingero.collectors.nodedb import read_window
from ingero.push.streams import decode_stream, split_steps
from tests.integration.trace.conftest import wait_rows

pytestmark = pytest.mark.integration

ITERS = 200
PREFILL_EVERY = 10
OTHER_EVERY = 5


def test_streams_counted_apart_and_decode_steps_split(
    start_tracer: Any, spawn: Any, stream_engine: Path
) -> None:
    env = dict(
        os.environ, STREAM_WAIT="1", STREAM_ITERS=str(ITERS), STREAM_DECODE_US="2000",
        STREAM_PREFILL_US="23000", STREAM_PREFILL_EVERY=str(PREFILL_EVERY),
        STREAM_OTHER_EVERY=str(OTHER_EVERY),
    )  # fmt: skip
    engine = spawn([str(stream_engine)], env)
    assert engine.stdout.readline().strip() == "ready"
    tracer = start_tracer("--pid", str(engine.pid))
    out, err = engine.communicate("go\n", timeout=120)
    assert engine.returncode == 0, err
    said = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    sql = "SELECT SUM(syncs) FROM stream_intervals WHERE pid = ?"
    want = int(said["decode_syncs"]) + int(said["other_syncs"])
    assert wait_rows(tracer.db, sql, (engine.pid,), want, tracer.notify) == want
    code, err = tracer.stop()
    assert code == 0, err
    conn = sqlite3.connect(tracer.db)
    try:
        rows = {
            stream: (syncs, launches, steps)
            for stream, syncs, launches, steps in conn.execute(
                "SELECT stream, SUM(syncs), SUM(launches), SUM(steps) FROM stream_intervals"
                " WHERE pid = ? GROUP BY stream",
                (engine.pid,),
            )
        }
        last = conn.execute("SELECT MAX(ts_end) FROM stream_intervals").fetchone()[0]
    finally:
        conn.close()
    decode, other = said["decode_stream"], said["other_stream"]
    assert rows == {
        # 3 runtime launches a step (the driver's cuLaunchKernel inside each is not counted
        # again); every sync but the stream's first ends a step.
        decode: (ITERS, 3 * ITERS, ITERS - 1),
        other: (ITERS // OTHER_EVERY, ITERS // OTHER_EVERY, ITERS // OTHER_EVERY - 1),
    }
    window = read_window(tracer.db, last, 3600.0)
    found = decode_stream(window.streams, {engine.pid})
    assert found is not None and found[0] == (engine.pid, decode)
    split = split_steps(found[1].hist, found[1].step_ns)
    assert split is not None and split.threshold_ns is not None
    prefills = ITERS // PREFILL_EVERY
    # Every prefill step is on the long side; a decode step the shared machine delayed
    # past the split may join them (a few at most).
    assert split.decode_steps + split.prefill_steps == ITERS - 1
    assert prefills <= split.prefill_steps <= prefills + (ITERS - 1 - prefills) // 10
    # 2 ms of work a decode step, 23 ms a prefill one (mid-bucket, where the split's
    # estimate of them is near exact): the split lies between them, and the prefill steps
    # are not in the decode mean (within the histogram's resolution).
    assert 0.9 * 2e6 <= split.decode_step_ns < split.threshold_ns
