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
    op_intervals,
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


LAUNCH = OP_IDS["cudaLaunchKernel"]


def sampled(timed: StatVal, hist: dict[int, int], entries: dict[int | None, int]) -> Snapshot:
    """A snapshot of pid 7's sampled launches: the timed sample and the entry counts by
    stream."""
    return Snapshot({}, {}, {}, timed={(7, LAUNCH): timed}, timed_hist={(7, LAUNCH): hist},
                    entries={(7, LAUNCH, s): n for s, n in entries.items()})  # fmt: skip


def test_sampled_launches_count_exactly_and_scale_their_sample() -> None:
    """1000 launches counted at entry, 10 timed with weight 100 (1000 launches' worth) in
    the previous interval; 2000 more, 20 timed (weight 64: 1280 launches' worth) now: the
    row counts 2000 and scales the sample's time and errors by 2000 / 1280."""
    fast, slow = slot_of(2_000), slot_of(200_000)
    prev = sampled(StatVal(1000, 1000 * 2_000, 0, 10), {fast: 1000}, {0: 600, None: 400})
    now = StatVal(1000 + 1280, 1000 * 2_000 + 1024 * 2_000 + 256 * 200_000, 64, 30)
    cur = sampled(now, {fast: 1000 + 1024, slow: 256}, {0: 1800, None: 1200})
    (o,) = op_intervals(prev, cur).values()
    assert (o.stat.count, o.timed) == (2000, 20)
    assert o.stat.total_ns == round((1024 * 2_000 + 256 * 200_000) * 2000 / 1280)
    assert o.stat.errors == 100
    (row,) = interval_rows(prev, cur, 0.0, 1.0, {})
    assert (row["count"], row["total_ns"], row["errors"]) == (2000, o.stat.total_ns, 100)
    # 20% of the weight is slow: the median is a fast launch, the p95 a slow one.
    assert int(row["p50_ns"]) < 4_000 < 100_000 < int(row["p95_ns"])  # type: ignore[call-overload]


def test_untimed_launches_still_count_and_add_no_time() -> None:
    prev = sampled(StatVal(64, 64_000, 0, 1), {slot_of(1000): 64}, {0: 100})
    cur = sampled(StatVal(64, 64_000, 0, 1), {slot_of(1000): 64}, {0: 150})
    (row,) = interval_rows(prev, cur, 0.0, 1.0, {})
    assert (row["count"], row["total_ns"], row["p50_ns"]) == (50, 0, 0)


def test_launches_timed_every_call_join_the_sampled_ones() -> None:
    """One library file's launches took a return each (a refused session link), another's
    were sampled: the row counts both, the histogram weighs each part by what it stands
    for."""
    fast, slow = slot_of(1_000), slot_of(1_000_000)
    cur = Snapshot(
        {(7, LAUNCH): StatVal(100, 100 * 1_000, 0, 0)}, {(7, LAUNCH): {fast: 100}}, {},
        timed={(7, LAUNCH): StatVal(900, 900 * 1_000_000, 0, 9)},
        timed_hist={(7, LAUNCH): {slow: 900}},
        entries={(7, LAUNCH, 0): 900},
    )  # fmt: skip
    (o,) = op_intervals(Snapshot({}, {}, {}), cur).values()
    assert (o.stat.count, o.timed, o.stat.total_ns) == (1000, 109, 100 * 1_000 + 900 * 10**6)
    assert percentile(o.hist, 0.05) < 2_000 < 900_000 < percentile(o.hist, 0.5)


def test_sampled_launches_count_on_their_stream() -> None:
    """Launches counted at entry that name a stream are that stream's launches, beside what
    the stream map counted (syncs, and launches that took a return)."""
    prev = Snapshot({}, {}, {}, {(7, 0x10): StreamVal(1, 10, 5, 0, 0, {})},
                    entries={(7, LAUNCH, 0x10): 100, (7, LAUNCH, None): 3})  # fmt: skip
    cur = Snapshot({}, {}, {}, {(7, 0x10): StreamVal(2, 20, 5, 1, 7, {slot_of(7): 1})},
                   entries={(7, LAUNCH, 0x10): 130, (7, LAUNCH, None): 9,
                            (7, OP_IDS["cuLaunchKernel"], 0x20): 4})  # fmt: skip
    got = {r["stream"]: r for r in stream_rows(prev, cur, 0.0, 1.0, {})}
    assert set(got) == {"0000000000000010", "0000000000000020"}
    assert (got["0000000000000010"]["launches"], got["0000000000000010"]["syncs"]) == (30, 1)
    assert (got["0000000000000020"]["launches"], got["0000000000000020"]["syncs"]) == (4, 0)
    assert cur.pids() == {7}


@given(
    st.lists(st.tuples(st.integers(0, 6), st.booleans(), st.sampled_from([None, 0, 0x10])),
             min_size=1, max_size=300),
)  # fmt: skip
def test_counts_are_exact_whatever_was_timed(launches: list[tuple[int, bool, int | None]]) -> None:
    """Each launch counted at entry on its stream, some timed with a weight 2^shift: the
    row's count and the streams' launches are exactly the launches, its time the weighted
    sample's scaled to them."""
    entries: dict[tuple[int, int, int | None], int] = {}
    w_count = w_total = timed = 0
    hist: dict[int, int] = {}
    for shift, is_timed, stream in launches:
        key = (7, LAUNCH, stream)
        entries[key] = entries.get(key, 0) + 1
        if is_timed:
            w = 1 << shift
            timed, w_count, w_total = timed + 1, w_count + w, w_total + 1000 * w
            hist[slot_of(1000)] = hist.get(slot_of(1000), 0) + w
    cur = Snapshot({}, {}, {}, timed={(7, LAUNCH): StatVal(w_count, w_total, 0, timed)} if timed
                   else {}, timed_hist={(7, LAUNCH): hist}, entries=entries)  # fmt: skip
    (o,) = op_intervals(Snapshot({}, {}, {}), cur).values()
    assert o.stat.count == len(launches)
    assert o.timed == timed
    assert o.stat.total_ns == (1000 * len(launches) if timed else 0)
    named = sum(1 for _, _, s in launches if s is not None)
    assert (
        sum(int(r["launches"]) for r in stream_rows(Snapshot({}, {}, {}), cur, 0, 1, {})) == named
    )  # type: ignore[call-overload]
