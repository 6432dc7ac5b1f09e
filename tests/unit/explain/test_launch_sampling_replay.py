"""Sampled launch durations on the H200 recordings (bench/launch_sampling.py): fleet-push
scores them the same, the sampled percentiles lie within the sample's error of every
launch's, and ``ingero explain`` finds the same, but where a latency finding's ratio sits
within that error of its threshold."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import launch_sampling
from ingero.explain.analysis import LATENCY_RATIO
from ingero.explain.reader import read_window_data
from ingero.nodedb.schema import open_node_db


def p95_ratio(db: Path, until: float, window_s: float, op: str) -> float:
    handle = open_node_db(db)
    try:
        recent = read_window_data(handle, db, until, window_s, None)
        base = read_window_data(handle, db, until - window_s, window_s, None)
    finally:
        handle.conn.close()
    now = next(o for o in recent.ops if o.op == op)
    before = next(o for o in base.ops if o.op == op)
    return now.p95_ns / before.p95_ns


@pytest.mark.parametrize("name", ["mlp.db", "decode.db", "graphs.db"])
def test_sampled_launches_give_the_same_detections(name: str, tmp_path: Path) -> None:
    src = launch_sampling.H200 / name
    c = launch_sampling.compare(
        src, tmp_path, launch_sampling.DEFAULT_TIMED_PER_S, 10.0, 2.0, redraw=False
    )
    assert c.launch_rows > 0 and c.untils > 0
    # Counts are exact: what fleet-push reads (rates, streams, syncs) is the same.
    assert c.scores_equal
    # Each sampled p50/p95/p99 lies within 2.5 standard errors of the sample's size (and a
    # histogram bucket) of the population's.
    assert c.errors.within >= 0.99 * c.errors.rows
    for q in (0.5, 0.95, 0.99):
        assert abs(c.errors.bias(q)) < 0.03, q
    # A finding may come or go only where its ratio with every launch timed lies within the
    # sample's error (here 5%) of explain's threshold.
    full = tmp_path / f"full-0-{name}"
    for until, timed, sampled in c.differing:
        for line in set(timed) ^ set(sampled):
            kind, op = line.split()[1:3]
            assert kind == "op_latency", line
            ratio = p95_ratio(full, until, c.window_s, op)
            assert abs(ratio / LATENCY_RATIO - 1) < 0.05, (line, ratio)
