"""A stand-in for the ``pynvml`` module surface ingero uses (there is no GPU or driver here).

Constants and the ``NVMLError`` classes are the real binding's, so an error code raised here
is exactly what the real module raises. Each GPU is a dict of what its calls return; a value
``Fail(code)`` makes that call raise ``NVMLError(code)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pynvml


@dataclass(frozen=True)
class Fail:
    code: int


@dataclass(frozen=True)
class Handle:
    index: int


def healthy_h100(**overrides: Any) -> dict[str, Any]:
    """What NVML reports for a busy, healthy H100 80GB (values in NVML's documented units)."""
    gpu: dict[str, Any] = {
        "utilization": 97,  # percent
        "memory": (85_520_809_984, 64_424_509_440, 21_096_300_544),  # total, used, free bytes
        "sm_clock": 1980,  # MHz
        "sm_clock_max": 1980,
        "event_reasons": 0x4,  # sw_power_cap
        "temperature": 61,  # °C
        "power": 612_345,  # milliwatts
        "ecc_corrected": 0,
        "ecc_uncorrected": 0,
        "retired_pages": Fail(pynvml.NVML_ERROR_NOT_SUPPORTED),  # Ampere on: row remapping
        "retired_pending": Fail(pynvml.NVML_ERROR_NOT_SUPPORTED),
        "remapped_rows": (0, 0, 0, 0),
        "processes": [(4242, 20 * 2**30)],
        "supported_events": pynvml.nvmlEventTypeXidCriticalError
        | pynvml.nvmlEventTypeDoubleBitEccError,
        "register": None,
    }
    gpu.update(overrides)
    return gpu


class FakeNvml:
    NVMLError = pynvml.NVMLError

    def __init__(
        self,
        gpus: list[dict[str, Any]],
        *,
        init: Fail | None = None,
        events: list[tuple[int, int, int]] | None = None,
        event_set: Fail | None = None,
    ) -> None:
        for name in dir(pynvml):
            if name.startswith(("NVML_", "nvmlEventType", "nvmlClocks")):
                setattr(self, name, getattr(pynvml, name))
        self.gpus = gpus
        self.init = init
        self.events = list(events or [])  # (gpu, event type, data)
        self.event_set = event_set
        self.inits = 0
        self.shutdowns = 0
        self.registered: list[int] = []

    def _value(self, handle: Handle, key: str) -> Any:
        value = self.gpus[handle.index][key]
        if isinstance(value, Fail):
            raise pynvml.NVMLError(value.code)
        return value

    def nvmlInit(self) -> None:
        self.inits += 1
        if self.init is not None:
            raise pynvml.NVMLError(self.init.code)

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        return Handle(index)

    def nvmlDeviceGetIndex(self, handle: Handle) -> int:
        return handle.index

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> Any:
        return SimpleNamespace(gpu=self._value(handle, "utilization"), memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: Handle) -> Any:
        total, used, free = self._value(handle, "memory")
        return SimpleNamespace(total=total, used=used, free=free)

    def nvmlDeviceGetClockInfo(self, handle: Handle, kind: int) -> int:
        assert kind == pynvml.NVML_CLOCK_SM
        return int(self._value(handle, "sm_clock"))

    def nvmlDeviceGetMaxClockInfo(self, handle: Handle, kind: int) -> int:
        assert kind == pynvml.NVML_CLOCK_SM
        return int(self._value(handle, "sm_clock_max"))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Handle) -> int:
        return int(self._value(handle, "event_reasons"))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Handle) -> int:
        gpu = self.gpus[handle.index]
        key = "throttle_reasons" if "throttle_reasons" in gpu else "event_reasons"
        return int(self._value(handle, key))

    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return int(self._value(handle, "temperature"))

    def nvmlDeviceGetPowerUsage(self, handle: Handle) -> int:
        return int(self._value(handle, "power"))

    def nvmlDeviceGetTotalEccErrors(self, handle: Handle, kind: int, counter: int) -> int:
        assert counter == pynvml.NVML_VOLATILE_ECC
        key = (
            "ecc_uncorrected"
            if kind == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
            else "ecc_corrected"
        )
        return int(self._value(handle, key))

    def nvmlDeviceGetRetiredPages(self, handle: Handle, cause: int) -> list[int]:
        pages = self._value(handle, "retired_pages")
        return list(pages[cause])

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Handle) -> int:
        return int(self._value(handle, "retired_pending"))

    def nvmlDeviceGetRemappedRows(self, handle: Handle) -> tuple[int, int, int, int]:
        return tuple(self._value(handle, "remapped_rows"))  # type: ignore[return-value]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[Any]:
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=used)
            for pid, used in self._value(handle, "processes")
        ]

    def nvmlEventSetCreate(self) -> str:
        if self.event_set is not None:
            raise pynvml.NVMLError(self.event_set.code)
        return "event-set"

    def nvmlEventSetFree(self, event_set: str) -> None:
        pass

    def nvmlDeviceGetSupportedEventTypes(self, handle: Handle) -> int:
        return int(self._value(handle, "supported_events"))

    def nvmlDeviceRegisterEvents(self, handle: Handle, types: int, event_set: str) -> None:
        self._value(handle, "register")
        self.registered.append(handle.index)

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> Any:
        assert timeout_ms == 0, "reading must never block"
        if not self.events:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        gpu, kind, data = self.events.pop(0)
        return SimpleNamespace(device=Handle(gpu), eventType=kind, eventData=data)
