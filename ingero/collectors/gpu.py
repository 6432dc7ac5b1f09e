"""GPU memory and utilisation through ``nvidia-smi`` (the one interface every driver ships).

``nvidia-smi --query-gpu=index,name,memory.free,memory.total,utilization.gpu
--format=csv,noheader,nounits``; ``[N/A]`` and ``[Not Supported]`` fields become None.
A host without nvidia-smi, or whose driver does not answer, is reported as having no GPU
data, never as an error that stops the agent.
"""

from __future__ import annotations

import csv
import shutil
import subprocess
from dataclasses import dataclass
from typing import Protocol

QUERY_FIELDS = "index,name,memory.free,memory.total,utilization.gpu"
COMMAND = ("nvidia-smi", f"--query-gpu={QUERY_FIELDS}", "--format=csv,noheader,nounits")
_UNKNOWN = frozenset({"[N/A]", "[Not Supported]", "N/A", "[Unknown Error]", "[GPU is lost]"})


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    mem_free_mib: float | None
    mem_total_mib: float | None
    utilization_percent: float | None


@dataclass(frozen=True)
class GpuStatus:
    """What one query found: the GPUs, or why there is no GPU data (``error``)."""

    gpus: tuple[GpuInfo, ...] = ()
    error: str | None = None


class GpuQuery(Protocol):
    def query(self) -> GpuStatus: ...


class GpuParseError(ValueError):
    pass


def _number(text: str) -> float | None:
    text = text.strip()
    if text in _UNKNOWN or not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise GpuParseError(f"not a number: {text!r}") from None
    return value if value >= 0 else None


def parse_query_output(text: str) -> tuple[GpuInfo, ...]:
    """Parse the CSV lines; raises GpuParseError on a line that is not a GPU record."""
    gpus: list[GpuInfo] = []
    for row in csv.reader(line for line in text.splitlines() if line.strip()):
        if len(row) != 5:
            raise GpuParseError(f"expected 5 fields, got {len(row)}: {','.join(row)[:120]!r}")
        index_text = row[0].strip()
        if not index_text.isdigit():
            raise GpuParseError(f"bad GPU index {index_text[:40]!r}")
        gpus.append(
            GpuInfo(
                index=int(index_text),
                name=row[1].strip(),
                mem_free_mib=_number(row[2]),
                mem_total_mib=_number(row[3]),
                utilization_percent=_number(row[4]),
            )
        )
    return tuple(gpus)


def interpret(returncode: int, stdout: str, stderr: str) -> GpuStatus:
    """Turn one nvidia-smi run into a status (pure; table-tested on captured outputs)."""
    message = (stdout.strip() or stderr.strip()).splitlines()
    first = message[0].strip() if message else ""
    if "No devices were found" in stdout + stderr:
        return GpuStatus(error="no GPU: nvidia-smi found no devices")
    if returncode != 0:
        return GpuStatus(error=f"nvidia-smi exited {returncode}: {first[:200] or 'no output'}")
    try:
        gpus = parse_query_output(stdout)
    except GpuParseError as exc:
        return GpuStatus(error=f"unexpected nvidia-smi output: {exc}")
    if not gpus:
        return GpuStatus(error="no GPU: nvidia-smi listed none")
    return GpuStatus(gpus=gpus)


class NvidiaSmi:
    """Runs nvidia-smi with a timeout; a missing binary means "no GPU"."""

    def __init__(self, binary: str = "nvidia-smi", timeout_s: float = 5.0) -> None:
        self.binary = binary
        self.timeout_s = timeout_s

    def query(self) -> GpuStatus:
        path = shutil.which(self.binary)
        if path is None:
            return GpuStatus(error=f"no GPU: {self.binary} not found")
        try:
            done = subprocess.run(
                [path, *COMMAND[1:]],
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return GpuStatus(error=f"nvidia-smi did not answer within {self.timeout_s:g} s")
        except OSError as exc:
            return GpuStatus(error=f"cannot run nvidia-smi: {exc.strerror}")
        return interpret(done.returncode, done.stdout, done.stderr)


class NoGpu:
    """For hosts known to have no GPU (and for the demo): always "no GPU"."""

    def query(self) -> GpuStatus:
        return GpuStatus(error="no GPU: disabled")


class FallbackQuery:
    """The first query that answers with GPUs; the last one's error when none does."""

    def __init__(self, *queries: GpuQuery) -> None:
        if not queries:
            raise ValueError("FallbackQuery needs at least one query")
        self.queries = queries

    def query(self) -> GpuStatus:
        status = GpuStatus(error="no GPU")
        for q in self.queries:
            status = q.query()
            if status.error is None:
                return status
        return status
