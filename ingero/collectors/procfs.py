"""Host CPU availability (from /proc/stat deltas) and memory (from /proc/meminfo).

The proc root is injectable so tests read fixture trees instead of the live system.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ingero.runtime.errors import IngeroError

# /proc/stat "cpu" columns: user nice system idle iowait irq softirq steal guest guest_nice.
# guest and guest_nice are already counted in user and nice, so they are left out of the total.
_IDLE_COLUMNS = (3, 4)  # idle, iowait
_COUNTED_COLUMNS = 8


class ProcfsError(IngeroError):
    """A /proc file is missing or not in the expected format."""


@dataclass(frozen=True)
class CpuTimes:
    busy: int
    total: int


@dataclass(frozen=True)
class MemInfo:
    total_kib: int
    available_kib: int

    @property
    def available_fraction(self) -> float:
        return self.available_kib / self.total_kib


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        raise ProcfsError(f"{path}: cannot read: {exc.strerror}") from None


def parse_stat(text: str, source: str = "/proc/stat") -> CpuTimes:
    """The aggregate ``cpu`` line of /proc/stat as busy and total jiffies."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            try:
                values = [int(v) for v in parts[1 : 1 + _COUNTED_COLUMNS]]
            except ValueError:
                raise ProcfsError(f"{source}: non-numeric value in the cpu line") from None
            if len(values) < 4 or any(v < 0 for v in values):
                raise ProcfsError(f"{source}: the cpu line has {len(values)} usable columns")
            total = sum(values)
            idle = sum(values[i] for i in _IDLE_COLUMNS if i < len(values))
            return CpuTimes(busy=total - idle, total=total)
    raise ProcfsError(f"{source}: no aggregate cpu line")


def parse_meminfo(text: str, source: str = "/proc/meminfo") -> MemInfo:
    fields: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[name.strip()] = int(parts[0])
    total = fields.get("MemTotal")
    available = fields.get("MemAvailable")
    if not total:
        raise ProcfsError(f"{source}: no MemTotal")
    if available is None:
        raise ProcfsError(f"{source}: no MemAvailable (kernel older than 3.14?)")
    return MemInfo(total_kib=total, available_kib=min(available, total))


def busy_fraction(previous: CpuTimes, current: CpuTimes) -> float | None:
    """Busy share of the jiffies between two readings; None when no time passed or counters reset."""
    total = current.total - previous.total
    busy = current.busy - previous.busy
    if total <= 0 or busy < 0:
        return None
    return min(1.0, busy / total)


class ProcReader:
    """Reads the host's CPU and memory; keeps the previous /proc/stat reading for deltas."""

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self.proc_root = proc_root
        self._previous: CpuTimes | None = None

    def cpu_times(self) -> CpuTimes:
        path = self.proc_root / "stat"
        return parse_stat(_read(path), str(path))

    def cpu_busy_fraction(self) -> float | None:
        """Busy fraction since the previous call (None on the first call)."""
        current = self.cpu_times()
        previous, self._previous = self._previous, current
        return None if previous is None else busy_fraction(previous, current)

    def meminfo(self) -> MemInfo:
        path = self.proc_root / "meminfo"
        return parse_meminfo(_read(path), str(path))
