"""Per-stream syncs, launches and steps, under the real tracer (stand-in libcudart/libcuda).

``stream_engine.c`` steps a decode stream through the runtime (launches with two ``dim3``
passed by value, then a stream sync), one step in ten a long prefill step on the same
stream, and a second stream through the driver (the stream in cuLaunchKernel's 9th
argument, on the stack). The node DB's ``stream_intervals`` holds both streams with the
counts the process made, and fleet-push's split of the decode stream's step times finds
its prefill steps. The same engine waiting only through events (an event recorded on the
stream, then synchronized) and launching with config structs counts the same, and an event
synchronized without a record counts nothing per stream, even after more events than the
tracer's event map holds.

``launch_ex.c`` launches on one stream through cuLaunchKernelEx and the real libcudart's
cudaLaunchKernelExC (the stream inside their config structs): the stream holds exactly
those launches.
"""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from ingero.nodedb.window import read_window
from ingero.push.streams import decode_stream, split_steps
from ingero.trace.probes import bpf_source_path
from tests.integration.trace.conftest import finish, wait_rows

pytestmark = pytest.mark.integration

ITERS = 200
PREFILL_EVERY = 10
OTHER_EVERY = 5


def event_map_size() -> int:
    """The entries of the program's event -> stream map (EVENT_STREAMS in the C source)."""
    found = re.search(r"^#define EVENT_STREAMS (\d+)", bpf_source_path().read_text(), re.M)
    assert found, "EVENT_STREAMS not in the BPF source"
    return int(found.group(1))


@pytest.mark.parametrize("wait_by", ["stream", "event"])
def test_streams_counted_apart_and_decode_steps_split(
    start_tracer: Any, spawn: Any, stream_engine: Path, wait_by: str
) -> None:
    env = dict(
        os.environ, STREAM_WAIT="1", STREAM_ITERS=str(ITERS), STREAM_DECODE_US="2000",
        STREAM_PREFILL_US="23000", STREAM_PREFILL_EVERY=str(PREFILL_EVERY),
        STREAM_OTHER_EVERY=str(OTHER_EVERY), STREAM_WAIT_BY=wait_by, STREAM_UNRECORDED="1",
    )  # fmt: skip
    # Events: first more than the map holds, recorded on a third stream and never waited on;
    # the oldest are forgotten, and the steps after them count as before.
    flood = event_map_size() + 4096 if wait_by == "event" else 0
    env["STREAM_FLOOD_EVENTS"] = str(flood)
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
        calls = dict(conn.execute(
            "SELECT op, SUM(count) FROM intervals WHERE pid = ? GROUP BY op", (engine.pid,)
        ).fetchall())  # fmt: skip
    finally:
        conn.close()
    decode, other = said["decode_stream"], said["other_stream"]
    others = ITERS // OTHER_EVERY
    assert rows == {
        # 3 runtime launches a step (the driver's launch inside each is not counted again);
        # every sync but the stream's first ends a step. Through events: the event synced
        # without a record and the flooded stream (records only) have no row.
        decode: (ITERS, 3 * ITERS, ITERS - 1),
        other: (others, others, others - 1),
    }
    if wait_by == "event":
        # Per op every call counts, the one never recorded too; the driver calls the
        # stand-in runtime makes inside its own are not counted again.
        assert {op: n for op, n in calls.items() if "Event" in op or "Ex" in op} == {
            "cudaLaunchKernelExC": 3 * ITERS,
            "cudaEventRecord": ITERS + flood,
            "cudaEventSynchronize": 2 * ITERS,
            "cuLaunchKernelEx": others,
            "cuEventRecord": others,
            "cuEventSynchronize": others,
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


def test_config_launches_counted_on_their_stream(
    start_tracer: Any, spawn: Any, launch_ex: Path
) -> None:
    proc = spawn([str(launch_ex), str(ITERS)])
    assert proc.stdout.readline().strip() == "ready"
    tracer = start_tracer("--pid", str(proc.pid))
    said = finish(proc)
    want = int(said["driver_launches"]) + int(said["runtime_launches"])
    sql = "SELECT SUM(launches) FROM stream_intervals WHERE pid = ?"
    assert wait_rows(tracer.db, sql, (proc.pid,), want, tracer.notify) == want
    code, err = tracer.stop()
    assert code == 0, err
    conn = sqlite3.connect(tracer.db)
    try:
        rows = conn.execute(
            "SELECT stream, SUM(syncs), SUM(launches), SUM(steps) FROM stream_intervals"
            " WHERE pid = ? GROUP BY stream",
            (proc.pid,),
        ).fetchall()
        calls = dict(conn.execute(
            "SELECT op, SUM(count) FROM intervals WHERE pid = ? GROUP BY op", (proc.pid,)
        ).fetchall())  # fmt: skip
    finally:
        conn.close()
    # The real runtime failed every launch (no driver) after its probe read the config.
    assert int(said["cudaLaunchKernelExC"]) != 0
    assert rows == [(said["stream"], 0, want, 0)]
    # The launches with no config count per op, on no stream.
    assert calls["cuLaunchKernelEx"] == int(said["driver_launches"]) + int(said["no_config"])
    assert calls["cudaLaunchKernelExC"] == int(said["runtime_launches"])
