"""Per-GPU readings from NVML, NVIDIA's management library, through ``nvidia-ml-py``.

One ``NvmlReader.read()`` per interval gives, for every GPU: utilization (busy fraction),
memory used/free/total, SM clock and its maximum, the clock event ("throttle") reasons, the
hardware-health counters (critical XID errors through NVML events, volatile ECC error counts,
retired pages, remapped rows), temperature, power, and the processes using the GPU with the
Slurm job each belongs to.

Errors are handled per field, because NVML answers them per field: a counter the GPU does not
have (``NVML_ERROR_NOT_SUPPORTED``) or may not be read (``NO_PERMISSION``) is *missing* (None,
with the reason in ``GpuReading.missing``), never 0. ``NVML_ERROR_GPU_IS_LOST`` marks that GPU
``lost`` and ends its reading. A host without the library or driver (``LIBRARY_NOT_FOUND``,
``DRIVER_NOT_LOADED``) gets a reading with ``error`` and no GPUs; initialisation is retried at
most every ``retry_s`` (a driver may load after ingero starts), except for a missing library.

The pynvml module is injectable: tests pass a fake with the same surface (functions, constants,
``NVMLError`` with ``.value``), since there is no GPU where they run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from ingero.collectors.gpu import GpuInfo, GpuStatus
from ingero.runtime.clock import Clock, SystemClock

log = logging.getLogger(__name__)

# NVML's clock event reasons (nvmlClocksEventReason*, formerly nvmlClocksThrottleReason*);
# the values are fixed by nvml.h.
THROTTLE_REASONS: Final[Mapping[int, str]] = MappingProxyType(
    {
        0x1: "gpu_idle",
        0x2: "applications_clocks_setting",
        0x4: "sw_power_cap",
        0x8: "hw_slowdown",
        0x10: "sync_boost",
        0x20: "sw_thermal_slowdown",
        0x40: "hw_thermal_slowdown",
        0x80: "hw_power_brake_slowdown",
        0x100: "display_clock_setting",
    }
)
# Reasons that mean the hardware is slowing the GPU down (heat, a power brake, the slowdown
# line): a health problem. The software power cap is left out: a GPU-bound job at full load
# meets it on healthy GPUs every day, and all peers of a job meet it alike.
DEGRADING_THROTTLE: Final = 0x8 | 0x20 | 0x40 | 0x80

# NVML error codes this module tells apart (nvml.h; also pynvml.NVML_ERROR_*).
NOT_SUPPORTED: Final = 3
NO_PERMISSION: Final = 4
DRIVER_NOT_LOADED: Final = 9
TIMEOUT: Final = 10
LIBRARY_NOT_FOUND: Final = 12
FUNCTION_NOT_FOUND: Final = 13
GPU_IS_LOST: Final = 15
_REASONS: Final = {
    NOT_SUPPORTED: "not supported",
    NO_PERMISSION: "no permission",
    FUNCTION_NOT_FOUND: "not in this driver",
}
XID_EVENT: Final = 0x8  # nvmlEventTypeXidCriticalError
# At most this many XID events are read per interval; the rest wait for the next one.
MAX_EVENTS_PER_READ: Final = 1000


def throttle_names(mask: int) -> list[str]:
    """The reasons set in an NVML clock-event bitmask, by name (unknown bits as hex)."""
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    rest = mask & ~sum(THROTTLE_REASONS)
    if rest:
        names.append(f"0x{rest:x}")
    return names


@dataclass(frozen=True)
class GpuProcess:
    """A process NVML lists as running compute work on a GPU, with its Slurm job if known."""

    pid: int
    used_memory_bytes: int | None = None
    job_id: str | None = None
    rank: int | None = None


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one moment. None is "not measured" (``missing`` says why, when NVML did)."""

    index: int
    lost: bool = False
    utilization: float | None = None  # busy fraction in [0, 1] over NVML's last sample period
    mem_used_bytes: int | None = None
    mem_free_bytes: int | None = None
    mem_total_bytes: int | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    throttle_reasons: int | None = None  # NVML clock event reasons bitmask
    temperature_c: int | None = None
    power_w: float | None = None
    ecc_corrected: int | None = None  # volatile counts: since the driver last loaded
    ecc_uncorrected: int | None = None
    retired_pages: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    xids: tuple[int, ...] | None = None  # critical XIDs since the previous read; None: not watched
    processes: tuple[GpuProcess, ...] | None = None
    missing: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NvmlReading:
    """All GPUs at one moment, or why NVML could not be read (``error``)."""

    gpus: tuple[GpuReading, ...] = ()
    error: str | None = None


JobOf = Callable[[int], tuple[str | None, int | None]]


def _no_job(_pid: int) -> tuple[str | None, int | None]:
    return None, None


class _Lost(Exception):
    pass


def _code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def load_pynvml() -> Any:
    """The real binding (imported on first use: most commands never need it)."""
    import pynvml

    return pynvml


class NvmlReader:
    """Reads every GPU through NVML; keeps the library initialised between reads."""

    def __init__(
        self,
        nvml: Any | None = None,
        *,
        job_of: JobOf = _no_job,
        clock: Clock | None = None,
        retry_s: float = 30.0,
        watch_xids: bool = True,
    ) -> None:
        self._nvml: Any = nvml  # None until first needed
        self._job_of = job_of
        self._clock = clock or SystemClock()
        self._retry_s = retry_s
        self._watch_xids = watch_xids
        self._handles: list[Any] = []
        self._events: Any = None
        self._watched: dict[int, str | None] = {}  # GPU -> None when watched, else why not
        self._ready = False
        self._error: str | None = None
        self._permanent = False
        self._next_try = 0.0

    def set_job_of(self, job_of: JobOf) -> None:
        """How a GPU process's pid maps to its Slurm job and rank."""
        self._job_of = job_of

    @property
    def error(self) -> str | None:
        """Why NVML is not usable now (None once it is, or before the first read)."""
        return self._error

    @property
    def gave_up(self) -> bool:
        """True when NVML can never be used by this process (no library, no binding)."""
        return self._permanent

    def _errors(self) -> Any:
        return self._nvml.NVMLError

    def _open(self) -> bool:
        if self._ready:
            return True
        if self._permanent or self._clock.monotonic() < self._next_try:
            return False
        self._next_try = self._clock.monotonic() + self._retry_s
        try:
            if self._nvml is None:
                self._nvml = load_pynvml()
        except ImportError as exc:
            self._error, self._permanent = f"no GPU: nvidia-ml-py is not installed ({exc})", True
            return False
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except self._errors() as exc:
            code = _code(exc)
            if code == LIBRARY_NOT_FOUND:
                self._error = "no GPU: the NVML library (libnvidia-ml.so.1) was not found"
                self._permanent = True
            elif code == DRIVER_NOT_LOADED:
                self._error = "no GPU: the NVIDIA driver is not loaded"
            else:
                self._error = f"NVML init failed: {exc}"
            return False
        try:
            count = int(nvml.nvmlDeviceGetCount())
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except self._errors() as exc:
            self._error = f"NVML cannot list the GPUs: {exc}"
            self._shutdown()
            return False
        if not self._handles:
            self._error = "no GPU: NVML lists none"
            self._shutdown()
            return False
        self._register_xids()
        self._ready, self._error = True, None
        return True

    def _register_xids(self) -> None:
        nvml = self._nvml
        self._watched = {}
        if not self._watch_xids:
            self._watched = {i: "not watched" for i in range(len(self._handles))}
            return
        try:
            self._events = nvml.nvmlEventSetCreate()
        except self._errors() as exc:
            self._watched = {
                i: _REASONS.get(_code(exc) or 0, str(exc)) for i in range(len(self._handles))
            }
            return
        for i, handle in enumerate(self._handles):
            try:
                supported = int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
                if not supported & XID_EVENT:
                    self._watched[i] = "not supported"
                    continue
                nvml.nvmlDeviceRegisterEvents(handle, XID_EVENT, self._events)
                self._watched[i] = None
            except self._errors() as exc:
                self._watched[i] = _REASONS.get(_code(exc) or 0, str(exc))

    def _shutdown(self) -> None:
        nvml = self._nvml
        if nvml is None:
            return
        if self._events is not None:
            try:
                nvml.nvmlEventSetFree(self._events)
            except self._errors():
                pass
            self._events = None
        try:
            nvml.nvmlShutdown()
        except self._errors():
            pass
        self._ready = False
        self._handles = []

    def close(self) -> None:
        if self._ready:
            self._shutdown()

    def read(self) -> NvmlReading:
        """Every GPU now; a reading with ``error`` when NVML cannot be used."""
        if not self._open():
            return NvmlReading(error=self._error or "NVML not initialised")
        xids = self._drain_xids()
        gpus = []
        for index, handle in enumerate(self._handles):
            gpus.append(self._read_gpu(index, handle, xids.get(index, [])))
        return NvmlReading(gpus=tuple(gpus))

    def _drain_xids(self) -> dict[int, list[int]]:
        """XIDs NVML queued since the last read (a zero timeout never blocks)."""
        found: dict[int, list[int]] = {}
        if self._events is None:
            return found
        nvml = self._nvml
        for _ in range(MAX_EVENTS_PER_READ):
            try:
                data = nvml.nvmlEventSetWait_v2(self._events, 0)
            except self._errors() as exc:
                if _code(exc) != TIMEOUT:
                    log.warning("NVML events: %s", exc)
                break
            if not int(data.eventType) & XID_EVENT:
                continue
            try:
                index = int(nvml.nvmlDeviceGetIndex(data.device))
            except self._errors():
                continue
            found.setdefault(index, []).append(int(data.eventData))
        return found

    def _get(self, missing: dict[str, str], name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """One NVML call: its value, or None with the reason recorded (GPU lost: raises)."""
        try:
            return fn(*args)
        except self._errors() as exc:
            code = _code(exc)
            if code == GPU_IS_LOST:
                raise _Lost from None
            missing[name] = _REASONS.get(code or 0, str(exc))
            return None

    def _read_gpu(self, index: int, handle: Any, xids: list[int]) -> GpuReading:
        missing: dict[str, str] = {}
        values: dict[str, Any] = {}
        watch = self._watched.get(index, "not watched")
        if watch is None:
            values["xids"] = tuple(xids)
        else:
            missing["xids"] = watch
        try:
            self._read_fields(handle, missing, values)
        except _Lost:
            return GpuReading(
                index=index, lost=True, xids=values.get("xids"), missing={"*": "GPU is lost"}
            )
        return GpuReading(index=index, missing=MappingProxyType(missing), **values)

    def _read_fields(self, handle: Any, missing: dict[str, str], values: dict[str, Any]) -> None:
        nvml = self._nvml

        def get(name: str, fn: Callable[..., Any], *args: Any) -> Any:
            return self._get(missing, name, fn, *args)

        util = get("utilization", nvml.nvmlDeviceGetUtilizationRates, handle)
        if util is not None:
            values["utilization"] = min(1.0, max(0.0, float(util.gpu) / 100.0))
        mem = get("memory", nvml.nvmlDeviceGetMemoryInfo, handle)
        if mem is not None:
            values["mem_total_bytes"] = int(mem.total)
            values["mem_free_bytes"] = int(mem.free)
            values["mem_used_bytes"] = int(mem.used)
        values["sm_clock_mhz"] = get(
            "sm_clock_mhz", nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM
        )
        values["sm_clock_max_mhz"] = get(
            "sm_clock_max_mhz", nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_SM
        )
        values["throttle_reasons"] = self._throttle(handle, missing)
        values["temperature_c"] = get(
            "temperature_c", nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU
        )
        power = get("power_w", nvml.nvmlDeviceGetPowerUsage, handle)  # milliwatts
        values["power_w"] = None if power is None else float(power) / 1000.0
        for name, kind in (
            ("ecc_corrected", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ("ecc_uncorrected", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        ):
            values[name] = get(
                name, nvml.nvmlDeviceGetTotalEccErrors, handle, kind, nvml.NVML_VOLATILE_ECC
            )
        # Page retirement (up to Volta) and row remapping (Ampere on) are each "not
        # supported" on the other generations.
        total: int | None = 0
        for cause in (
            nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
            nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
        ):
            pages = get("retired_pages", nvml.nvmlDeviceGetRetiredPages, handle, cause)
            total = None if pages is None or total is None else total + len(pages)
        values["retired_pages"] = total
        pending = get("retired_pages_pending", nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
        values["retired_pages_pending"] = None if pending is None else bool(pending)
        rows = get("remapped_rows", nvml.nvmlDeviceGetRemappedRows, handle)
        if rows is not None:
            corr, unc, remap_pending, failure = rows
            values["remapped_rows_correctable"] = int(corr)
            values["remapped_rows_uncorrectable"] = int(unc)
            values["remap_pending"] = bool(remap_pending)
            values["remap_failure"] = bool(failure)
        procs = get("processes", nvml.nvmlDeviceGetComputeRunningProcesses, handle)
        if procs is not None:
            values["processes"] = tuple(self._process(p) for p in procs)

    def _throttle(self, handle: Any, missing: dict[str, str]) -> int | None:
        # Drivers before the "clock event reasons" rename (R535) have only the old name.
        for name in (
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
        ):
            fn = getattr(self._nvml, name, None)
            if fn is None:
                continue
            try:
                return int(fn(handle))
            except self._errors() as exc:
                code = _code(exc)
                if code == GPU_IS_LOST:
                    raise _Lost from None
                if code == FUNCTION_NOT_FOUND:
                    continue
                missing["throttle_reasons"] = _REASONS.get(code or 0, str(exc))
                return None
        missing["throttle_reasons"] = _REASONS[FUNCTION_NOT_FOUND]
        return None

    def _process(self, proc: Any) -> GpuProcess:
        pid = int(proc.pid)
        used = getattr(proc, "usedGpuMemory", None)
        job_id, rank = self._job_of(pid)
        return GpuProcess(
            pid=pid,
            used_memory_bytes=None if used is None else int(used),
            job_id=job_id,
            rank=rank,
        )


def as_gpu_status(reading: NvmlReading) -> GpuStatus:
    """An NVML reading in the shape of an nvidia-smi query (memory in MiB, utilization %)."""
    if reading.error is not None:
        return GpuStatus(error=reading.error)
    mib = 1024.0 * 1024.0
    return GpuStatus(
        gpus=tuple(
            GpuInfo(
                index=g.index,
                name="",
                mem_free_mib=None if g.mem_free_bytes is None else g.mem_free_bytes / mib,
                mem_total_mib=None if g.mem_total_bytes is None else g.mem_total_bytes / mib,
                utilization_percent=None if g.utilization is None else 100.0 * g.utilization,
            )
            for g in reading.gpus
            if not g.lost
        )
    )


class NvmlQuery:
    """``GpuQuery`` through NVML (fleet-push's live reading where the node DB has no GPU rows)."""

    def __init__(self, reader: NvmlReader | None = None) -> None:
        # XIDs reach the score through the node DB; registering for NVML events needs root.
        self.reader = reader or NvmlReader(watch_xids=False)

    def query(self) -> GpuStatus:
        return as_gpu_status(self.reader.read())
