"""``ingero workload --cause``: the rows a node records of each cause make ``ingero explain``
name that cause first, read back through explain's own reader from a DB the runner wrote."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from ingero.demo.runner import CAUSE_RULES
from ingero.explain.chains import Chain, explain_chains, load_rules
from ingero.explain.reader import read_timeline
from ingero.nodedb.schema import open_node_db
from ingero.workload.generator import CAUSES, IO_P99_NS, SM_CLOCK_MHZ, WorkloadProfile
from ingero.workload.runner import WorkloadRunner

T0 = 1_700_000_000.0
TICKS = 120  # one-second intervals, as `ingero trace --interval 1` records them
SLOW_FROM = 60  # the slowdown starts with interval 61: the recent minute against the one before
WINDOW = float(TICKS - SLOW_FROM)


class StepClock:
    """Each ``now()`` is one interval later; the runner is stopped after ``ticks`` intervals."""

    def __init__(self, ticks: int) -> None:
        self.wall = T0
        self.ticks = ticks
        self.calls = 0
        self.stop: threading.Event | None = None

    def now(self) -> float:
        self.calls += 1
        if self.calls > self.ticks and self.stop is not None:
            self.stop.set()  # this interval is still written; the loop ends after it
        self.wall += 0 if self.calls == 1 else 1.0
        return self.wall

    def monotonic(self) -> float:
        return self.wall - T0


def record(path: Path, cause: str | None, shape: str = "gpu-bound", slowdown: float = 0.3) -> Path:
    """Two minutes of one traced process, slowed by ``cause`` in the second."""
    clock = StepClock(TICKS)
    runner = WorkloadRunner(
        path,
        WorkloadProfile(shape=shape, job_id="7", rank=0, pid=4242),
        interval_s=0.0005,
        slowdown=slowdown,
        seed=5,
        clock=clock,
        cause=cause,
        slow_after=None if cause is None and slowdown == 0 else SLOW_FROM + 0.5,
    )
    clock.stop = runner.stop_event
    assert runner.run() == TICKS
    return path


def chains(path: Path) -> list[Chain]:
    db = open_node_db(path)
    try:
        return explain_chains(read_timeline(db, T0 + TICKS, WINDOW, None))
    finally:
        db.conn.close()


def test_every_cause_has_the_rule_that_names_it() -> None:
    assert set(CAUSE_RULES) == set(CAUSES)
    assert set(CAUSE_RULES.values()) <= {r.id for r in load_rules()}


@pytest.mark.parametrize(
    ("shape", "cause", "slowdown"),
    [
        *[("gpu-bound", cause, 0.3) for cause in CAUSES],
        # A CPU-launch-bound loop's threads are already off-CPU ~2 s per second: a 30% CPU
        # contention adds less than explain's 1.5x, a 40% one more (docs/demo.md).
        ("cpu-bound", "cpu", 0.4),
        ("cpu-bound", "alloc", 0.3),
        ("cpu-bound", "throttle", 0.3),
        ("cpu-bound", "net", 0.3),
        # A job replaying CUDA graphs: its work is its graph launches.
        *[("graphs", cause, 0.3) for cause in CAUSES],
    ],
)
def test_explain_names_the_injected_cause_first(
    tmp_path: Path, shape: str, cause: str, slowdown: float
) -> None:
    found = chains(record(tmp_path / "n.db", cause, shape, slowdown))
    top = found[0]
    assert top.rule == CAUSE_RULES[cause], [c.headline() for c in found]
    # the effect is the launch-rate drop: the process did 1 - slowdown of its work
    metric = "graph-launch rate" if shape == "graphs" else "kernel-launch rate"
    assert top.effect is not None and top.effect.evidence["metric"] == metric
    assert top.effect.evidence["drop"] == pytest.approx(slowdown, abs=0.03)
    # the cause began with the slowdown, in the first recent interval
    assert all(c.onset == T0 + SLOW_FROM + 1 for c in top.causes)
    assert top.level in ("high", "medium")


def test_each_cause_is_written_as_a_node_records_it(tmp_path: Path) -> None:
    evidence = {}
    for cause in CAUSES:
        top = chains(record(tmp_path / f"{cause}.db", cause))[0]
        evidence[cause] = {s.id: s.evidence for s in top.causes}
    # cpu: the process's threads are switched out in scheduler slices (32/s at rest, +100/s)
    offcpu = evidence["cpu"]["offcpu"]
    assert 120 < offcpu["switch_rate"] < 145 and 29 < offcpu["switch_rate_baseline"] < 35
    assert offcpu["offcpu_fraction"] > 2 * offcpu["offcpu_fraction_baseline"]
    assert offcpu["processes"][0]["pid"] == 4242
    # io: blocking reads of congested storage, the page cache filling, the thread waiting
    io = evidence["io"]
    assert io["block_io"]["p99_ns"] == IO_P99_NS and 160 < io["block_io"]["rate"] < 180
    assert io["page_allocs"]["rate"] > 8 * io["page_allocs"]["rate_baseline"]
    assert set(io) == {"offcpu", "block_io", "page_allocs"}
    # alloc: cuMemAlloc in the loop (the driver API, as PyTorch allocates on CUDA 13)
    alloc = evidence["alloc"]["alloc_churn"]
    assert (alloc["op"], alloc["source"]) == ("cuMemAlloc", "cuda_driver")
    assert 950 < alloc["rate"] < 1150 and alloc["rate_baseline"] == 0
    # throttle: NVML's thermal slowdown reason in every interval, named
    throttle = evidence["throttle"]["gpu_throttle"]
    assert throttle["throttled_intervals"] == throttle["intervals"] == 60
    assert throttle["reasons"] == ["throttle_reasons=0x20 (sw_thermal_slowdown)"]
    # net: retransmits that were not there before
    net = evidence["net"]["tcp_retransmits"]
    assert net["retransmits_baseline"] == 0 and 30_000 < net["retransmits"] < 42_000
    # recapture: graphs captured and instantiated in the loop, the host's time in them
    recapture = evidence["recapture"]["graph_recapture"]
    assert recapture["rate_baseline"] == 0 and 28 < recapture["rate"] < 32
    assert recapture["share"] == pytest.approx(0.3, abs=0.03)
    assert recapture["ops"] == [
        "cudaGraphInstantiate", "cudaStreamBeginCapture", "cudaStreamEndCapture"
    ]  # fmt: skip


def test_a_throttled_gpu_is_as_busy_but_slower(tmp_path: Path) -> None:
    path = record(tmp_path / "n.db", "throttle")
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT ts_end > ?, AVG(busy_ns), AVG(sm_clock_mhz), MAX(temperature_c)"
            " FROM gpu_intervals GROUP BY 1 ORDER BY 1",
            (T0 + SLOW_FROM,),
        ).fetchall()
    (_, busy_before, clock_before, _), (_, busy_after, clock_after, temp_after) = rows
    assert busy_after == pytest.approx(busy_before, rel=0.03)
    assert clock_before == SM_CLOCK_MHZ and clock_after == round(SM_CLOCK_MHZ * 0.7)
    assert temp_after >= 85


@pytest.mark.parametrize("shape", ["gpu-bound", "cpu-bound"])
def test_a_steady_workload_has_no_chain(tmp_path: Path, shape: str) -> None:
    # The software power cap a GPU-bound loop meets now and then is no GPU throttling.
    assert chains(record(tmp_path / "n.db", None, shape, slowdown=0.0)) == []
