"""GPU hardware health: its factor on the score and the gpu_throttle/gpu_xid/gpu_ecc events."""

from __future__ import annotations

from typing import Any

import pytest

from ingero.nodedb.window import GpuWindow
from ingero.push.gpu_health import GpuHealthTracker, gpu_events
from ingero.push.score import GpuHealthConfig
from ingero.schema.events import MESSAGE_IDS, Event

CFG = GpuHealthConfig()  # throttle_penalty 0.2, error_penalty 0.5, error_hold 60 s


def gw(gpu: int = 0, **values: Any) -> GpuWindow:
    """A GPU window that reported health; healthy unless told otherwise."""
    base: dict[str, Any] = {
        "busy": 0.98,
        "throttle_rows": 5,
        "xid_watched": True,
        "counters": {"ecc_uncorrected": 0, "remapped_rows_uncorrectable": 0},
        "new": {"ecc_uncorrected": 0, "remapped_rows_uncorrectable": 0},
        "remap_pending": False,
        "remap_failure": False,
    }
    base.update(values)
    return GpuWindow(gpu=gpu, **base)


@pytest.mark.parametrize(
    ("window", "factor", "types"),
    [
        (gw(), 1.0, []),
        # Software power cap at full load: healthy GPUs meet it every day.
        (gw(throttle_reasons=0x4), 1.0, []),
        (gw(throttled_rows=5, throttle_reasons=0x40), 0.8, ["gpu_throttle"]),
        (gw(throttled_rows=1, throttle_reasons=0x8), 1.0 - 0.2 * 0.2, []),  # 1 of 5 samples
        (gw(xids=((10.0, 79),)), 0.5, ["gpu_xid"]),
        (gw(counters={"ecc_uncorrected": 3}, new={"ecc_uncorrected": 3}), 0.5, ["gpu_ecc"]),
        (gw(remap_pending=True), 0.5, ["gpu_ecc"]),
        (gw(remap_failure=True), 0.5, ["gpu_ecc"]),
        (gw(lost=True, throttle_rows=0, xid_watched=False), 0.0, ["gpu_xid"]),
    ],
)
def test_one_window(window: GpuWindow, factor: float, types: list[str]) -> None:
    health = GpuHealthTracker(CFG).observe({0: window}, now=100.0)
    assert health.value == pytest.approx(factor)
    assert [f.type for f in health.findings] == types


def test_no_gpu_reporting_health_is_missing_not_healthy() -> None:
    tracker = GpuHealthTracker(CFG)
    assert tracker.observe({}, 0.0).value is None
    smi_only = GpuWindow(gpu=0, busy=0.5, mem_free_bytes=1, mem_total_bytes=2)
    assert tracker.observe({0: smi_only}, 0.0).value is None


def test_the_worst_gpu_is_the_node_s_health() -> None:
    health = GpuHealthTracker(CFG).observe(
        {0: gw(0), 1: gw(1, throttled_rows=5, throttle_reasons=0x20), 2: gw(2)}, 0.0
    )
    assert health.value == pytest.approx(0.8)
    assert health.per_gpu == pytest.approx({0: 1.0, 1: 0.8, 2: 1.0})


def test_an_xid_degrades_for_the_hold_and_is_reported_once() -> None:
    tracker = GpuHealthTracker(CFG)
    first = tracker.observe({0: gw(xids=((100.0, 48),))}, now=100.0)
    assert first.value == 0.5 and [f.extra["xids"] for f in first.findings] == [[48]]
    # The next window overlaps the XID's row (push jitter): not a second event.
    again = tracker.observe({0: gw(xids=((100.0, 48),))}, now=105.0)
    assert again.findings == () and again.value == 0.5
    assert tracker.observe({0: gw()}, now=159.0).value == 0.5
    assert tracker.observe({0: gw()}, now=161.0).value == 1.0


def test_ecc_growth_is_reported_when_it_grows_not_every_window() -> None:
    tracker = GpuHealthTracker(CFG)
    grown = gw(counters={"ecc_uncorrected": 2}, new={"ecc_uncorrected": 2})
    (finding,) = tracker.observe({0: grown}, 0.0).findings
    assert finding.extra["ecc_uncorrected_new"] == 2 and finding.extra["ecc_uncorrected"] == 2
    steady = gw(counters={"ecc_uncorrected": 2}, new={"ecc_uncorrected": 0})
    assert tracker.observe({0: steady}, 5.0).findings == ()
    more = gw(counters={"ecc_uncorrected": 3}, new={"ecc_uncorrected": 1})
    (finding,) = tracker.observe({0: more}, 10.0).findings
    assert finding.extra["ecc_uncorrected_new"] == 1


def test_a_pending_remap_degrades_while_it_lasts_and_is_reported_once() -> None:
    tracker = GpuHealthTracker(CFG)
    assert len(tracker.observe({0: gw(remap_pending=True)}, 0.0).findings) == 1
    later = tracker.observe({0: gw(remap_pending=True)}, 3600.0)
    assert later.findings == () and later.value == 0.5


def test_throttle_episode_starts_and_ends_with_one_event_id() -> None:
    tracker = GpuHealthTracker(CFG)
    hot = gw(throttled_rows=4, throttle_reasons=0x44, sm_clock_mhz=1410.0, sm_clock_max_mhz=1980)
    (start,) = tracker.observe({0: hot}, 0.0).findings
    assert start.extra["state"] == "start"
    assert start.extra["reasons"] == ["hw_thermal_slowdown"]
    assert start.extra["sm_clock_mhz"] == 1410
    assert tracker.observe({0: hot}, 5.0).findings == ()
    assert tracker.observe({0: gw(throttled_rows=1, throttle_reasons=0x40)}, 10.0).findings == ()
    (end,) = tracker.observe({0: gw()}, 15.0).findings
    assert end.extra["state"] == "end" and end.event_id == start.event_id


def test_findings_become_events_of_the_common_schema() -> None:
    tracker = GpuHealthTracker(CFG)
    findings = tracker.observe(
        {3: gw(3, xids=((1.0, 79), (1.0, 45)), counters={"ecc_uncorrected": 1},
               new={"ecc_uncorrected": 1})}, 1.0
    ).findings  # fmt: skip
    events = gpu_events(
        findings, node_id="gpu-07", cluster_id="c1", timestamp=2.0, job_id="42", rank=3, score=0.4
    )
    assert [e.type for e in events] == ["gpu_xid", "gpu_ecc"]
    xid, ecc = events
    assert xid.extra["gpu"] == 3 and xid.extra["xids"] == [79, 45]
    assert xid.message() == (
        "ingero gpu_xid: node gpu-07 job 42 GPU 3 score=0.400 signal=gpu_health (XID 79, 45)"
    )
    assert ecc.message().endswith("(1 ecc uncorrected)")
    journal = xid.journal_fields()
    assert journal["MESSAGE_ID"] == MESSAGE_IDS["gpu_xid"] and journal["PRIORITY"] == "3"
    assert journal["INGERO_GPU"] == "3"
    # Every channel's round trip keeps the fields.
    assert Event.from_dict(xid.to_dict()) == xid
