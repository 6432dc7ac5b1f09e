"""Inference steps per (process, stream): the decode stream, the prefill/decode split, the
node DB's stream rows as fleet-push reads them, and the step rate it pushes."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingero.nodedb.window import StreamWindow, aggregate_window, read_latest
from ingero.otlp.health import INFERENCE_STEP_RATE
from ingero.push.sampler import NodeSample
from ingero.push.streams import SPLIT_RATIO, decode_step_rate, decode_stream, split_steps
from ingero.runtime.clock import ManualClock
from ingero.trace.aggregate import slot_of
from tests.unit.push.test_sampler import Node, sampler, vllm_tree

MS = 1_000_000


def hist(*groups: tuple[float, int]) -> dict[int, int]:
    """(step time in ms, how many) → a histogram of the tracer's slots."""
    out: dict[int, int] = {}
    for ms, n in groups:
        slot = slot_of(int(ms * MS))
        out[slot] = out.get(slot, 0) + n
    return out


@pytest.mark.parametrize(
    ("steps", "decode", "prefill", "decode_ms"),
    [
        # One mode: nothing split, every step decode (the exact total gives the mean).
        ([(10, 100)], 100, 0, 10.0),
        # Spread of one mode (batch sizes, jitter): under SPLIT_RATIO apart, not split.
        ([(8, 50), (10, 50), (14, 50), (20, 10)], 160, 0, None),
        # Prefill 200 ms every tenth step, decode 10 ms: split, the short side decodes.
        ([(10, 90), (200, 10)], 90, 10, 10.0),
        # A rare long prefill is still its own mode.
        ([(10, 999), (300, 1)], 999, 1, 10.0),
        # Prefill steps outnumber decode ones (a prefill-heavy burst): still split by time.
        ([(5, 10), (100, 40)], 10, 40, 5.0),
        # Two modes just at the ratio are split; just under are not.
        ([(10, 50), (10 * SPLIT_RATIO * 1.2, 50)], 50, 50, 10.0),
        ([(10, 50), (10 * SPLIT_RATIO * 0.7, 50)], 100, 0, None),
        # Decode with jitter plus prefill: the jitter stays decode.
        ([(9, 40), (10, 40), (12, 20), (150, 8), (180, 2)], 100, 10, 10.0),
    ],
)
def test_split_rule(
    steps: list[tuple[float, int]], decode: int, prefill: int, decode_ms: float | None
) -> None:
    h = hist(*steps)
    total = int(sum(ms * MS * n for ms, n in steps))
    split = split_steps(h, total)
    assert split is not None
    assert (split.decode_steps, split.prefill_steps) == (decode, prefill)
    assert (split.threshold_ns is not None) == (prefill > 0)
    if decode_ms is not None:
        # Bucket midpoints where split: within a bucket's half width (12.5%).
        assert split.decode_step_ns == pytest.approx(decode_ms * MS, rel=0.125)
    if prefill == 0:
        assert split.decode_ns == total  # unsplit: the exact mean


def test_decode_steps_across_a_bucket_boundary_keep_their_mean() -> None:
    """Decode steps of 4.15 and 4.25 ms lie either side of 2^22 ns, in buckets 14% and 25%
    wide: their midpoints would say 4.63 ms (9% off). The exact total less the prefill
    steps' estimate, kept within the decode buckets, stays within 5%."""
    steps = [(4.15, 10), (4.25, 80), (60, 10)]
    split = split_steps(hist(*steps), int(sum(ms * MS * n for ms, n in steps)))
    assert split is not None and (split.decode_steps, split.prefill_steps) == (90, 10)
    assert split.decode_step_ns == pytest.approx((4.15 * 10 + 4.25 * 80) / 90 * MS, rel=0.05)


def test_no_steps_no_split() -> None:
    assert split_steps({}) is None
    assert split_steps({50: 0}) is None
    # Slots the tracer never writes (a bad row) are no steps.
    assert split_steps({4: 3, 7: 1, 160: 2, -1: 5}) is None


@given(
    st.dictionaries(
        st.integers(0, 3) | st.integers(8, 159), st.integers(1, 10**6), min_size=1, max_size=40
    ),
    st.one_of(st.none(), st.integers(0, 2**50)),
)
def test_split_keeps_every_step_once(h: dict[int, int], total: int | None) -> None:
    split = split_steps(h, total)
    assert split is not None
    assert split.decode_steps + split.prefill_steps == sum(h.values())
    assert split.decode_steps > 0 and split.decode_step_ns > 0
    if split.threshold_ns is not None:
        # Every decode bucket lies below the split, every prefill one at or above it.
        decode_slots = [s for s in h if slot_of(split.threshold_ns) > s]
        assert sum(h[s] for s in decode_slots) == split.decode_steps


def sw(syncs: int, steps: int = 0, ms: float = 10.0) -> StreamWindow:
    return StreamWindow(syncs=syncs, launches=3 * syncs, steps=steps, step_ns=int(steps * ms * MS),
                        hist=hist((ms, steps)) if steps else {})  # fmt: skip


def test_the_decode_stream_is_the_one_with_most_syncs_in_the_tree() -> None:
    streams = {
        (41, "a"): sw(100, 99, 10),  # the worker's decode stream
        (41, "b"): sw(10, 9, 50),  # its other stream
        (40, "c"): sw(50, 49, 1),  # the server process
        (42, "d"): sw(5000, 4999, 1),  # another process, not the server's
    }
    assert decode_stream(streams, {40, 41}) == ((41, "a"), streams[(41, "a")])
    assert decode_step_rate(streams, {40, 41}) == pytest.approx(100.0)  # 1 / 10 ms
    assert decode_stream(streams, {43}) is None and decode_step_rate(streams, {43}) is None
    # Ties: more steps, then the lower key.
    assert decode_stream({(1, "b"): sw(5, 4), (1, "a"): sw(5, 4)}, {1})[0] == (1, "a")  # type: ignore[index]
    # A stream that synced once timed no step: no rate.
    assert decode_step_rate({(1, "a"): sw(1)}, {1}) is None


def _row(ts: float, pid: int, stream: str, **kw: Any) -> dict[str, Any]:
    return {"ts_start": ts - 1, "ts_end": ts, "pid": pid, "stream": stream, "syncs": 10,
            "launches": 30, "steps": 10, "step_ns": 10**8, **kw}  # fmt: skip


def test_window_sums_stream_rows_and_skips_bad_histograms() -> None:
    rows = [
        _row(1.0, 7, "a", step_hist=json.dumps({"90": 4, "91": 6})),
        _row(2.0, 7, "a", step_hist=json.dumps({"91": 10})),
        _row(2.0, 7, "b", step_hist="not json"),
        _row(
            2.0,
            8,
            "a",
            step_hist=json.dumps({"x": 1, "92": -3, "93": "4", "²": 1, "95": True, "94": 2}),
        ),
        _row(9.0, 7, "a", step_hist="{}"),  # outside the window
    ]
    w = aggregate_window(0.0, 5.0, [], stream_rows=rows)
    assert w.streams[(7, "a")] == StreamWindow(20, 60, 20, 2 * 10**8, {90: 4, 91: 16})
    assert w.streams[(7, "b")] == StreamWindow(10, 30, 10, 10**8, {})
    assert w.streams[(8, "a")].hist == {94: 2}


@given(st.lists(st.one_of(st.text(max_size=40), st.binary(max_size=40).map(repr),
                          st.dictionaries(st.text(max_size=4), st.integers() | st.text(max_size=3),
                                          max_size=5).map(json.dumps),
                          st.lists(st.integers(), max_size=4).map(json.dumps)),
                max_size=6))  # fmt: skip
def test_any_step_histogram_text_is_read_or_left_out(texts: list[str]) -> None:
    w = aggregate_window(0.0, 5.0, [], stream_rows=[_row(1.0, 1, "a", step_hist=t) for t in texts])
    if texts:
        s = w.streams[(1, "a")]
        assert s.syncs == 10 * len(texts)
        assert all(k >= 0 and v > 0 for k, v in s.hist.items())


def run_server(
    tmp_path: Path,
    syncs: tuple[int, ...],
    streams: list[dict[str, Any]],
    version: int = 6,
    sync_op: str = "cudaStreamSynchronize",
) -> NodeSample:
    """Four 2 s intervals of a node whose server's worker (pid 41) made ``syncs`` calls of
    ``sync_op`` and, on a version 6 node DB, ``streams`` rows (their ``ts`` set per
    interval)."""
    clock = ManualClock()
    node = Node(tmp_path, clock)
    if version < 6:
        node.db.execute("DROP TABLE stream_intervals")
        node.db.execute(f"PRAGMA user_version = {version}")
    s = sampler(tmp_path, clock, engines=vllm_tree(tmp_path, clock))
    sample = None
    for _ in range(4):
        node.run(2.0)
        now = clock.now()
        with node.db.conn:
            node.db.table("intervals").insert_all(
                {"ts_start": now - 2.0, "ts_end": now, "pid": 41, "source": "cuda_runtime",
                 "op": sync_op, "count": count, "total_ns": 10**6}
                for count in syncs
            )  # fmt: skip
            if streams:
                node.db.table("stream_intervals").insert_all(
                    {**row, "ts_start": now - 2.0, "ts_end": now} for row in streams
                )
        sample = s.sample()
    assert sample is not None and sample.result is not None and sample.window is not None
    assert "inference_step_rate" in s.baselines.baselines  # learned, whichever the source
    return sample


def test_the_step_rate_follows_the_decode_stream_not_the_syncs(tmp_path: Path) -> None:
    """The worker syncs its decode stream 100 times an interval at 10 ms a decode step, one
    step in ten a 200 ms prefill, and another stream 30 times: the step rate is the decode
    steps' (100/s), not syncs per second of the tree (130 in 2 s) nor the mean step."""
    decode = hist((10, 90), (200, 10))
    sample = run_server(tmp_path, (100, 30), [
        {**_row(0, 41, "00007f00c0de0000", syncs=100, steps=100, step_ns=2_900 * MS),
         "step_hist": json.dumps({str(k): v for k, v in decode.items()})},
        {**_row(0, 41, "00007f00a11e0000", syncs=30, steps=30, step_ns=30 * 60 * MS),
         "step_hist": json.dumps({str(slot_of(60 * MS)): 30})},
    ])  # fmt: skip
    assert sample.window is not None and sample.result is not None
    assert sample.window.syncs[41] == 130
    assert sample.result.rates[INFERENCE_STEP_RATE] == pytest.approx(100.0, rel=0.125)


def test_an_engine_that_waits_on_events_steps_on_its_decode_stream(tmp_path: Path) -> None:
    """vLLM and SGLang wait for the sampled tokens through an event (recorded on the stream,
    then synchronized): the tracer counts those waits as the stream's syncs, and the event
    synchronize calls are the tree's syncs, so the step rate is the decode stream's."""
    decode = hist((10, 90), (200, 10))
    sample = run_server(tmp_path, (100,), [
        {**_row(0, 41, "00007f00c0de0000", syncs=100, steps=100, step_ns=2_900 * MS),
         "step_hist": json.dumps({str(k): v for k, v in decode.items()})},
    ], sync_op="cudaEventSynchronize")  # fmt: skip
    assert sample.window is not None and sample.result is not None
    assert sample.window.syncs[41] == 100
    assert sample.result.rates[INFERENCE_STEP_RATE] == pytest.approx(100.0, rel=0.125)


def test_a_version_5_node_db_steps_at_its_synchronize_calls(tmp_path: Path) -> None:
    """No stream rows (a tracer before version 6): the tree's syncs per second, as before."""
    sample = run_server(tmp_path, (100,), [], version=5)
    assert sample.window is not None and sample.result is not None
    assert sample.window.streams == {}
    rate = sample.result.rates[INFERENCE_STEP_RATE]
    assert rate is not None and math.isclose(rate, 100 / sample.window.covered_s)
    # fleet-push's read of it is unchanged: read_latest on a version 5 DB.
    assert read_latest(tmp_path / "node.db", 1e12, 2.0, None).streams == {}
