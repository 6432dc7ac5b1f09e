"""aggregate: log-linear buckets, percentiles, snapshot differences, interval rows."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ingero.trace.aggregate import (
    NSLOTS,
    Snapshot,
    StatVal,
    StreamVal,
    Tags,
    diff_stats,
    host_row,
    interval_rows,
    percentile,
    slot_bounds,
    slot_of,
    stream_rows,
)
from ingero.trace.ops import OP_IDS


@given(st.integers(min_value=0, max_value=2**40 - 1))
def test_every_value_lies_in_its_bucket(v: int) -> None:
    lo, hi = slot_bounds(slot_of(v))
    assert lo <= v < hi
    if v >= 4:
        assert (hi - lo) / lo <= 0.25


@given(st.integers(min_value=2**40, max_value=2**64 - 1))
def test_huge_values_share_the_last_bucket(v: int) -> None:
    assert slot_of(v) == NSLOTS - 1


def test_slots_are_monotonic() -> None:
    slots = [slot_of(v) for v in range(0, 5000)]
    assert slots == sorted(slots)


def _hist(values: list[int]) -> dict[int, int]:
    h: dict[int, int] = {}
    for v in values:
        h[slot_of(v)] = h.get(slot_of(v), 0) + 1
    return h


def test_percentiles_within_bucket_error_of_exact() -> None:
    rng = np.random.default_rng(7)
    values = [int(v) for v in rng.lognormal(mean=8, sigma=1.0, size=20000)]
    h = _hist(values)
    for q in (0.5, 0.95, 0.99):
        exact = float(np.percentile(values, q * 100, method="inverted_cdf"))
        assert abs(percentile(h, q) - exact) <= 0.25 * exact, q


def test_percentile_edge_cases() -> None:
    assert percentile({}, 0.5) == 0
    assert percentile({slot_of(1000): 1}, 0.99) == percentile({slot_of(1000): 1}, 0.5)
    assert percentile({0: 5}, 0.5) == 0
    assert percentile({slot_of(100): 99, slot_of(10**6): 1}, 0.99) < 200
    assert percentile({slot_of(100): 98, slot_of(10**6): 2}, 0.99) > 9 * 10**5


def test_diff_handles_new_reset_and_idle_entries() -> None:
    prev = {(1, 0): StatVal(10, 100, 1, 5), (1, 1): StatVal(5, 50), (2, 0): StatVal(7, 70)}
    cur = {(1, 0): StatVal(15, 160, 1, 9), (1, 1): StatVal(5, 50), (2, 0): StatVal(3, 30),
           (3, 0): StatVal(1, 10)}  # fmt: skip
    d = diff_stats(prev, cur)
    assert d == {(1, 0): StatVal(5, 60, 0, 4), (2, 0): StatVal(3, 30), (3, 0): StatVal(1, 10)}


def test_interval_rows_tagged_with_percentiles() -> None:
    op = OP_IDS["cudaMalloc"]
    prev = Snapshot({(7, op): StatVal(10, 10_000)}, {(7, op): {slot_of(1000): 10}}, {})
    cur = Snapshot({(7, op): StatVal(20, 30_000, 20, 40960)},
                   {(7, op): {slot_of(1000): 10, slot_of(2000): 10}}, {})  # fmt: skip
    (row,) = interval_rows(prev, cur, 100.0, 101.0, {7: Tags("99", 1)})
    assert row["op"] == "cudaMalloc" and row["source"] == "cuda_runtime"
    assert (row["count"], row["total_ns"], row["errors"], row["bytes"]) == (10, 20_000, 20, 40960)
    assert (row["job_id"], row["rank"]) == ("99", 1)
    # Only this interval's 10 calls (all ~2000 ns) count, not the earlier ~1000 ns ones.
    assert 1792 <= int(row["p50_ns"]) <= 2304  # type: ignore[call-overload]
    assert row["p50_ns"] <= row["p95_ns"] <= row["p99_ns"]  # type: ignore[operator]


def test_untagged_process() -> None:
    op = OP_IDS["offcpu"]
    cur = Snapshot({(5, op): StatVal(1, 10)}, {(5, op): {slot_of(10): 1}}, {})
    (row,) = interval_rows(Snapshot({}, {}, {}), cur, 0.0, 1.0, {})
    assert (row["source"], row["job_id"], row["rank"]) == ("host", None, None)


def test_stream_rows_are_the_interval_of_each_process_and_stream() -> None:
    """A row per (pid, stream) that synced or launched: the interval's deltas and step
    histogram; an idle stream writes none; a re-created entry counts from zero; a handle
    past 2^63 keeps its 16 hex digits."""
    big = 2**64 - 16
    prev = Snapshot({}, {}, {}, {
        (7, 0x10): StreamVal(10, 500, 30, 9, 9_000_000, {slot_of(10**6): 9}),
        (7, 0x20): StreamVal(4, 40, 4, 3, 3000, {slot_of(1000): 3}),
        (8, 0x10): StreamVal(50, 50, 50, 49, 49, {slot_of(1): 49}),
    })  # fmt: skip
    cur = Snapshot({}, {}, {}, {
        (7, 0x10): StreamVal(20, 1500, 60, 19, 29_000_000,
                             {slot_of(10**6): 9, slot_of(2 * 10**6): 10}),
        (7, 0x20): StreamVal(4, 40, 4, 3, 3000, {slot_of(1000): 3}),
        (8, 0x10): StreamVal(2, 20, 0, 1, 1000, {slot_of(1000): 1}),
        (9, big): StreamVal(0, 0, 5, 0, 0, {}),
    })  # fmt: skip
    rows = stream_rows(prev, cur, 100.0, 101.0, {7: Tags("99", 1)})
    got = {(r["pid"], r["stream"]): r for r in rows}
    assert set(got) == {(7, "0000000000000010"), (8, "0000000000000010"), (9, "fffffffffffffff0")}
    a = got[(7, "0000000000000010")]
    assert (a["syncs"], a["sync_ns"], a["launches"], a["steps"], a["step_ns"]) == (
        10, 1000, 30, 10, 20_000_000,
    )  # fmt: skip
    assert (a["job_id"], a["rank"], a["ts_start"], a["ts_end"]) == ("99", 1, 100.0, 101.0)
    # Only this interval's 10 steps of 2 ms, not the earlier 1 ms ones.
    assert a["step_hist"] == f'{{"{slot_of(2 * 10**6)}": 10}}'
    assert 1.75e6 <= a["step_p50_ns"] <= a["step_p90_ns"] <= 2.3e6  # type: ignore[operator]
    reset = got[(8, "0000000000000010")]
    assert (reset["syncs"], reset["launches"], reset["steps"]) == (2, 0, 1)
    launches_only = got[(9, "fffffffffffffff0")]
    assert (launches_only["syncs"], launches_only["launches"], launches_only["step_hist"]) == (
        0, 5, "{}",
    )  # fmt: skip


def test_host_row_deltas() -> None:
    prev = Snapshot({}, {}, {"page_allocs": 100, "dropped_events": 2, "offcpu_ns": 5})
    cur = Snapshot({}, {}, {"page_allocs": 150, "dropped_events": 3, "offcpu_ns": 50,
                            "tcp_retransmits": 4, "block_io_count": 2})  # fmt: skip
    row = host_row(prev, cur, 1.0, 2.0, {slot_of(500_000): 2})
    assert (row["page_allocs"], row["dropped_events"], row["offcpu_ns"]) == (50, 1, 45)
    assert (row["tcp_retransmits"], row["block_io_count"]) == (4, 2)
    assert 400_000 < int(row["block_io_p99_ns"]) < 600_000  # type: ignore[call-overload]
