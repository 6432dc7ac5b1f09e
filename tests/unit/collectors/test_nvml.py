"""NVML readings through a stand-in of the pynvml module: values in NVML's documented ranges,
per-field errors (not supported, no permission, GPU lost), no library/driver, XID events."""

from __future__ import annotations

from typing import Any

import pynvml
import pytest

from ingero.collectors import nvml as mod
from ingero.collectors.gpu import GpuInfo, GpuStatus
from ingero.collectors.nvml import (
    DEGRADING_THROTTLE,
    GpuProcess,
    NvmlQuery,
    NvmlReader,
    NvmlReading,
    throttle_names,
)
from ingero.runtime.clock import ManualClock
from ingero.trace.gpusampler import GpuSampler, reading_rows
from tests.unit.fake_pynvml import Fail, FakeNvml, healthy_h100

NOT_SUPPORTED = Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
NO_PERMISSION = Fail(pynvml.NVML_ERROR_NO_PERMISSION)
LOST = Fail(pynvml.NVML_ERROR_GPU_IS_LOST)


def read(fake: FakeNvml, **kwargs: Any) -> NvmlReading:
    return NvmlReader(fake, **kwargs).read()


def test_healthy_h100_reads_every_field_in_nvml_units() -> None:
    jobs = {4242: ("1234", 3)}
    reading = NvmlReader(
        FakeNvml([healthy_h100()]), job_of=lambda pid: jobs.get(pid, (None, None))
    ).read()
    assert reading.error is None
    (g,) = reading.gpus
    assert g.utilization == pytest.approx(0.97)
    assert (g.mem_total_bytes, g.mem_used_bytes, g.mem_free_bytes) == (
        85_520_809_984,
        64_424_509_440,
        21_096_300_544,
    )
    assert (g.sm_clock_mhz, g.sm_clock_max_mhz) == (1980, 1980)
    assert g.throttle_reasons == 0x4 and throttle_names(g.throttle_reasons) == ["sw_power_cap"]
    assert g.temperature_c == 61
    assert g.power_w == pytest.approx(612.345)  # NVML reports milliwatts
    assert (g.ecc_corrected, g.ecc_uncorrected) == (0, 0)
    # An H100 remaps rows; page retirement is "not supported": missing, not zero.
    assert g.retired_pages is None and g.retired_pages_pending is None
    assert g.missing["retired_pages"] == "not supported"
    assert (g.remapped_rows_correctable, g.remapped_rows_uncorrectable) == (0, 0)
    assert (g.remap_pending, g.remap_failure) == (False, False)
    assert g.xids == ()
    assert g.processes == (GpuProcess(4242, 20 * 2**30, "1234", 3),)
    assert not g.lost


@pytest.mark.parametrize(
    ("percent", "fraction"), [(0, 0.0), (1, 0.01), (50, 0.5), (100, 1.0), (101, 1.0)]
)
def test_utilization_percent_becomes_a_busy_fraction_in_0_1(percent: int, fraction: float) -> None:
    (g,) = read(FakeNvml([healthy_h100(utilization=percent)])).gpus
    assert g.utilization == pytest.approx(fraction)


@pytest.mark.parametrize(
    ("key", "fail", "fields", "reason"),
    [
        ("utilization", NOT_SUPPORTED, ["utilization"], "not supported"),
        ("memory", NOT_SUPPORTED, ["mem_total_bytes", "mem_used_bytes", "mem_free_bytes"],
         "not supported"),
        ("sm_clock", NOT_SUPPORTED, ["sm_clock_mhz"], "not supported"),
        ("event_reasons", NOT_SUPPORTED, ["throttle_reasons"], "not supported"),
        ("temperature", NOT_SUPPORTED, ["temperature_c"], "not supported"),
        ("power", NOT_SUPPORTED, ["power_w"], "not supported"),
        # A GPU without ECC (or with it disabled): the counters are missing, never 0.
        ("ecc_uncorrected", NOT_SUPPORTED, ["ecc_uncorrected"], "not supported"),
        ("ecc_corrected", NOT_SUPPORTED, ["ecc_corrected"], "not supported"),
        ("remapped_rows", NOT_SUPPORTED, ["remapped_rows_correctable",
         "remapped_rows_uncorrectable", "remap_pending", "remap_failure"], "not supported"),
        ("processes", NO_PERMISSION, ["processes"], "no permission"),
        ("utilization", Fail(pynvml.NVML_ERROR_UNKNOWN), ["utilization"], "Unknown Error"),
    ],
)  # fmt: skip
def test_a_failing_field_is_missing_with_its_reason_and_the_rest_is_read(
    key: str, fail: Fail, fields: list[str], reason: str
) -> None:
    (g,) = read(FakeNvml([healthy_h100(**{key: fail})])).gpus
    for name in fields:
        assert getattr(g, name) is None, name
    assert reason in g.missing.values()
    # Everything else still came through.
    assert g.sm_clock_max_mhz == 1980
    assert not g.lost


def test_gpu_is_lost_marks_that_gpu_and_the_others_are_read() -> None:
    fake = FakeNvml([healthy_h100(memory=LOST), healthy_h100(utilization=40)])
    first, second = read(fake).gpus
    assert first.lost and first.utilization is None and first.missing == {"*": "GPU is lost"}
    assert not second.lost and second.utilization == pytest.approx(0.4)


def test_retired_pages_are_counted_over_both_causes_on_gpus_that_retire_pages() -> None:
    pages = {
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS: [0x1000, 0x2000],
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: [0x3000],
    }
    (g,) = read(
        FakeNvml(
            [healthy_h100(retired_pages=pages, retired_pending=1, remapped_rows=NOT_SUPPORTED)]
        )
    ).gpus
    assert g.retired_pages == 3 and g.retired_pages_pending is True
    assert g.remapped_rows_uncorrectable is None


def test_old_driver_without_event_reasons_uses_the_throttle_reasons_call() -> None:
    gpu = healthy_h100(
        event_reasons=Fail(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND), throttle_reasons=0x48
    )
    (g,) = read(FakeNvml([gpu])).gpus
    assert g.throttle_reasons == 0x48
    assert throttle_names(0x48) == ["hw_slowdown", "hw_thermal_slowdown"]
    assert g.throttle_reasons & DEGRADING_THROTTLE


def test_xid_events_are_drained_per_gpu_without_blocking() -> None:
    xid = pynvml.nvmlEventTypeXidCriticalError
    fake = FakeNvml(
        [healthy_h100(), healthy_h100()],
        events=[(1, xid, 79), (0, pynvml.nvmlEventTypeDoubleBitEccError, 0), (0, xid, 13)],
    )
    reader = NvmlReader(fake)
    first, second = reader.read().gpus
    assert first.xids == (13,) and second.xids == (79,)
    assert fake.registered == [0, 1]
    # Drained: the next read starts from nothing.
    assert [g.xids for g in reader.read().gpus] == [(), ()]


@pytest.mark.parametrize(
    ("gpu", "event_set", "reason"),
    [
        (healthy_h100(supported_events=0), None, "not supported"),
        (healthy_h100(register=NO_PERMISSION), None, "no permission"),
        (healthy_h100(), NO_PERMISSION, "no permission"),
    ],
)
def test_xids_not_watched_are_missing_not_an_empty_list(
    gpu: dict[str, Any], event_set: Fail | None, reason: str
) -> None:
    (g,) = read(FakeNvml([gpu], event_set=event_set)).gpus
    assert g.xids is None and g.missing["xids"] == reason
    assert g.utilization is not None


@pytest.mark.parametrize(
    ("code", "message", "retried"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "no GPU: the NVML library", False),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "no GPU: the NVIDIA driver is not loaded", True),
        (pynvml.NVML_ERROR_NO_PERMISSION, "NVML init failed: Insufficient Permissions", True),
    ],
)
def test_no_library_or_driver_is_an_error_reading_and_init_is_retried_only_when_it_can_help(
    code: int, message: str, retried: bool
) -> None:
    clock = ManualClock()
    fake = FakeNvml([healthy_h100()], init=Fail(code))
    reader = NvmlReader(fake, clock=clock, retry_s=30.0)
    first = reader.read()
    assert first.gpus == () and first.error is not None and first.error.startswith(message)
    reader.read()
    assert fake.inits == 1  # not before retry_s
    clock.advance(31.0)
    fake.init = None  # the driver is loaded now
    later = reader.read()
    assert fake.inits == (2 if retried else 1)
    assert (later.error is None) is retried


def test_no_gpus_listed_is_an_error() -> None:
    assert read(FakeNvml([])).error == "no GPU: NVML lists none"


def test_real_pynvml_on_this_machine_reports_no_driver_cleanly() -> None:
    reader = NvmlReader()
    reading = reader.read()
    if reading.error is None:
        pytest.skip("this machine has an NVIDIA driver")
    assert reading.gpus == ()
    assert reading.error.startswith("no GPU:") or reading.error.startswith("NVML init failed")
    reader.close()
    assert NvmlQuery(reader).query().error == reading.error


def test_module_constants_are_nvml_s() -> None:
    assert mod.NOT_SUPPORTED == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert mod.NO_PERMISSION == pynvml.NVML_ERROR_NO_PERMISSION
    assert mod.DRIVER_NOT_LOADED == pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    assert mod.TIMEOUT == pynvml.NVML_ERROR_TIMEOUT
    assert mod.LIBRARY_NOT_FOUND == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    assert mod.FUNCTION_NOT_FOUND == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    assert mod.GPU_IS_LOST == pynvml.NVML_ERROR_GPU_IS_LOST
    assert pynvml.nvmlEventTypeXidCriticalError == mod.XID_EVENT
    names = {
        "gpu_idle": "GpuIdle",
        "applications_clocks_setting": "ApplicationsClocksSetting",
        "sw_power_cap": "SwPowerCap",
        "hw_slowdown": "HwSlowdown",
        "sync_boost": "SyncBoost",
        "sw_thermal_slowdown": "SwThermalSlowdown",
        "hw_thermal_slowdown": "HwThermalSlowdown",
        "hw_power_brake_slowdown": "HwPowerBrakeSlowdown",
        "display_clock_setting": "DisplayClockSetting",
    }
    for bit, name in mod.THROTTLE_REASONS.items():
        assert getattr(pynvml, f"nvmlClocksEventReason{names[name]}") == bit


def test_nvml_query_gives_nvidia_smi_shaped_status() -> None:
    status = NvmlQuery(NvmlReader(FakeNvml([healthy_h100(), healthy_h100(memory=LOST)]))).query()
    assert status.error is None
    assert status.gpus == (GpuInfo(0, "", 21_096_300_544 / 2**20, 85_520_809_984 / 2**20, 97.0),)


class Smi:
    def __init__(self) -> None:
        self.calls = 0

    def query(self) -> GpuStatus:
        self.calls += 1
        return GpuStatus(gpus=(GpuInfo(0, "H100", 40960.0, 81920.0, 50.0),))


def test_sampler_rows_from_nvml_carry_health_and_processes() -> None:
    clock = ManualClock()
    fake = FakeNvml(
        [healthy_h100(ecc_uncorrected=2, event_reasons=0x40)],
        events=[(0, pynvml.nvmlEventTypeXidCriticalError, 48)],
    )
    sampler = GpuSampler(NvmlReader(fake, clock=clock), Smi(), clock=clock)
    rows = sampler.sample(100.0, 101.0)
    assert rows.error is None
    (row,) = rows.intervals
    assert row["source"] == "nvml"
    assert row["busy_ns"] == 970_000_000
    assert row["throttle_reasons"] == 0x40 and row["ecc_uncorrected"] == 2
    assert row["xid_count"] == 1 and row["xids"] == "[48]"
    assert row["retired_pages"] is None  # not supported: NULL, not 0
    assert rows.processes == [
        {"ts_end": 101.0, "gpu": 0, "pid": 4242, "used_memory_bytes": 20 * 2**30,
         "job_id": None, "rank": None}
    ]  # fmt: skip


def test_sampler_falls_back_to_nvidia_smi_at_most_every_period() -> None:
    clock = ManualClock()
    smi = Smi()
    nvml = NvmlReader(FakeNvml([], init=Fail(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)), clock=clock)
    sampler = GpuSampler(nvml, smi, clock=clock, smi_period_s=5.0)
    first = sampler.sample(0.0, 1.0)
    assert first.intervals[0]["source"] == "nvidia-smi"
    assert first.intervals[0]["busy_ns"] == 500_000_000
    assert first.intervals[0]["mem_used_bytes"] == 40960 * 2**20
    for second in range(2, 6):
        clock.advance(1.0)
        assert sampler.sample(second - 1.0, float(second)).intervals == []
    clock.advance(1.0)
    later = sampler.sample(5.0, 6.0)
    # The row covers the five seconds since the previous query.
    assert (later.intervals[0]["ts_start"], later.intervals[0]["ts_end"]) == (1.0, 6.0)
    assert smi.calls == 2


def test_sampler_without_any_source_says_why() -> None:
    nvml = NvmlReader(FakeNvml([], init=Fail(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)))
    rows = GpuSampler(nvml, None).sample(0.0, 1.0)
    assert rows.intervals == [] and rows.error == "no GPU: the NVIDIA driver is not loaded"


def test_reading_rows_of_a_lost_gpu() -> None:
    reading = read(FakeNvml([healthy_h100(utilization=LOST)]))
    (row,) = reading_rows(reading, 0.0, 1.0).intervals
    assert row["lost"] == 1 and row["busy_ns"] is None and row["mem_total_bytes"] is None


def test_sampler_says_once_what_a_gpu_does_not_report(caplog: pytest.LogCaptureFixture) -> None:
    sampler = GpuSampler(NvmlReader(FakeNvml([healthy_h100(processes=NO_PERMISSION)])), None)
    with caplog.at_level("WARNING", logger="ingero.trace.gpusampler"):
        for second in range(3):
            sampler.sample(float(second), second + 1.0)
    (line,) = caplog.messages
    assert line == (
        "GPU 0: not measured: processes (no permission), retired_pages (not supported),"
        " retired_pages_pending (not supported)"
    )
