"""The tracing loop: attach, then every interval poll samples, diff the maps, write a batch."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ingero.nodedb.writer import Batch
from ingero.runtime.clock import Clock
from ingero.schema.stacks import Stack
from ingero.trace.aggregate import Snapshot, diff_hist, host_row, interval_rows, stream_rows
from ingero.trace.collectives import Collectives
from ingero.trace.decode import KIND_ENTER, KIND_EXIT, KIND_NEW, DecodeError, TraceEvent, decode
from ingero.trace.gpusampler import GpuRows
from ingero.trace.ops import CUDA, CUDART, NCCL
from ingero.trace.procmaps import DEFAULT_PROC, LibraryFile, scan, unique_libraries
from ingero.trace.stacks import StackResolver
from ingero.trace.tags import TagCache

EMPTY = Snapshot({}, {}, {})
# The samples a tick reads before it closes the interval: bounded, so a flood of samples
# delays the interval by at most this (what is left is read by the next pumps).
TICK_PUMP_S = 0.05


class ProbeSet(Protocol):
    """What the loop needs from the loaded BPF program (``probes.Probes``)."""

    def attach_library(self, lib: LibraryFile) -> list[Any]: ...
    def mark_traced(self, pids: list[int]) -> None: ...
    def forget(self, pids: set[int]) -> None: ...
    def snapshot(self) -> tuple[Snapshot, dict[int, int]]: ...
    def open_ring(self, callback: Callable[[bytes], None]) -> None: ...
    def poll(self, budget_s: float | None = None) -> None: ...


class BatchSink(Protocol):
    def submit(self, batch: Batch) -> bool: ...


class GpuRowSource(Protocol):
    """Per-GPU rows for one interval (``ingero.trace.gpusampler.GpuSampler``)."""

    def sample(self, ts_start: float, ts_end: float) -> GpuRows: ...


@dataclass
class TickResult:
    """One interval, for the live view and the service status line."""

    ts_start: float
    ts_end: float
    intervals: list[dict[str, object]]
    host: dict[str, object]
    samples: int
    bad_samples: int
    probes: int
    processes: int
    gpus: int = 0  # GPU rows written for the interval
    # The interval's sampled calls (raw_events rows, each with its stack_key or None) and
    # the stacks they refer to, for the live view's call sites.
    raw_events: list[dict[str, object]] = field(default_factory=list)
    stacks: dict[str, Stack] = field(default_factory=dict)


@dataclass
class Tracer:
    probes: ProbeSet
    sink: BatchSink
    clock: Clock
    tags: TagCache
    pid: int | None = None
    proc: Path = DEFAULT_PROC
    extra_libraries: list[LibraryFile] = field(default_factory=list)
    gpu: GpuRowSource | None = None
    nccl: Collectives = field(default_factory=Collectives)
    stacks: StackResolver | None = None  # None: samples carry no stacks (--no-stacks)
    _prev: Snapshot = EMPTY
    _prev_bio: dict[int, int] = field(default_factory=dict)
    _last: float = 0.0
    _samples: list[TraceEvent] = field(default_factory=list)
    _new: list[int] = field(default_factory=list)
    _bad_samples: int = 0
    _exited: set[int] = field(default_factory=set)
    _known: dict[int, float] = field(default_factory=dict)
    _probe_count: int = 0
    _gpu_error: str | None = None

    @property
    def probe_count(self) -> int:
        return self._probe_count

    def start(self) -> None:
        """Attach to the libraries mapped now (plus extras) and open the ring buffer."""
        self.probes.open_ring(self.on_sample)
        for lib in self.extra_libraries:
            self._probe_count += len(self.probes.attach_library(lib))
        self.rescan()
        self._prev, self._prev_bio = self.probes.snapshot()
        self._last = self.clock.now()

    def rescan(self) -> None:
        """Find processes mapping the libraries; attach new library files, mark processes."""
        procs = scan(None if self.pid is None else [self.pid], self.proc)
        for lib in unique_libraries(procs):
            self._probe_count += len(self.probes.attach_library(lib))
        self._register([p.pid for p in procs])
        if self.stacks is not None:
            self.stacks.refresh(everyone=True)  # threads started since

    def _register(self, pids: list[int]) -> None:
        new = [p for p in pids if p not in self._known and p not in self._exited]
        if not new:
            return
        now = self.clock.now()
        for p in new:
            self._known[p] = now
            self.tags.get(p)
        self.probes.mark_traced(new)
        if self.stacks is not None:
            self.stacks.register(new)

    def on_sample(self, data: bytes) -> None:
        try:
            event = decode(data)
        except DecodeError as exc:
            self._bad_samples += 1
            print(f"ingero trace: bad sample: {exc}", file=sys.stderr)
            return
        if self.stacks is not None:
            # Symbolised now, while the process (its maps, its code objects) still exists;
            # the tick finds the result in the resolver's cache.
            self.stacks.resolve(event)
        if event.kind == KIND_NEW:
            self._new.append(event.pid)
        else:
            self._samples.append(event)

    def pump(self, budget_s: float | None = None) -> None:
        """Between ticks: read pending samples (for at most ``budget_s``) and tag processes
        that just started calling."""
        self.probes.poll(budget_s)
        if self._new:
            new, self._new = self._new, []
            self._register(new)
        if self.stacks is not None:
            self.stacks.refresh()  # Python threads a sample found unmapped

    def tick(self, final: bool = False) -> TickResult:
        """Close the current interval: write its aggregates, samples and host context.
        ``final``: the last one (tracing stops): collectives in flight are written now."""
        self.pump(TICK_PUMP_S)
        cur, bio = self.probes.snapshot()
        now = self.clock.now()
        mono_ns = int(self.clock.monotonic() * 1e9)
        self._register(sorted(cur.pids()))
        tags = self.tags.snapshot()
        rows = interval_rows(self._prev, cur, self._last, now, tags)
        streams = stream_rows(self._prev, cur, self._last, now, tags)
        host = host_row(self._prev, cur, self._last, now, diff_hist(self._prev_bio, bio))
        samples, self._samples = self._samples, []
        raw: list[dict[str, object]] = []
        stacks: dict[str, Stack] = {}
        first_seen: dict[str, float] = {}
        for ev in samples:
            if ev.kind == KIND_EXIT:
                self._exited.add(ev.pid)
            ts = now - (mono_ns - ev.ts_ns) / 1e9
            stack = self.stacks.resolve(ev) if self.stacks is not None else None
            key = stack.key() if stack is not None else None
            if stack is not None and key is not None:
                stacks[key] = stack
                first_seen[key] = min(ts, first_seen.get(key, ts))
            key = self.nccl.feed(ev, ts, key)
            if ev.kind == KIND_ENTER:
                continue  # an arrival: its call is one raw event, at its return
            tag = tags.get(ev.pid)
            raw.append(
                {
                    "ts": ts,
                    "pid": ev.pid,
                    "tid": ev.tid,
                    "job_id": tag.job_id if tag else None,
                    "rank": tag.rank if tag else None,
                    "source": ev.source,
                    "op": ev.op,
                    "duration_ns": ev.duration_ns,
                    "ret": ev.ret,
                    "bytes": ev.bytes,
                    "detail": ev.detail(),
                    "stack_key": key,
                }
            )
        processes = [self._process_row(p, now) for p in sorted({r["pid"] for r in rows})]  # type: ignore[type-var]
        gpu = self._gpu_rows(self._last, now)
        nccl = self.nccl.close(now, tags, final)
        stack_rows = [{"stack_key": k, "frames": st.dumps(), "first_seen": first_seen[k],
                       "last_seen": now} for k, st in stacks.items()]  # fmt: skip
        self.sink.submit(
            Batch(rows, raw, [host], [p for p in processes if p], gpu.intervals, gpu.processes,
                  nccl.calls, nccl.comms, stack_rows, nccl_returns=nccl.returns,
                  stream_intervals=streams)
        )  # fmt: skip
        result = TickResult(
            self._last, now, rows, host, len(samples), self._bad_samples,
            self._probe_count, len(self._known), len(gpu.intervals), raw, stacks,
        )  # fmt: skip
        self._prev, self._prev_bio, self._last = cur, bio, now
        if self._exited:
            # Their final counts are in this interval; now free the kernel entries.
            self.probes.forget(self._exited)
            if self.stacks is not None:
                self.stacks.forget(self._exited)
            for p in self._exited:
                self._known.pop(p, None)
                self.tags.forget(p)
            self._exited = set()
        return result

    def _gpu_rows(self, ts_start: float, ts_end: float) -> GpuRows:
        """This interval's GPU rows; a GPU problem is logged once (when it changes), and
        tracing goes on without GPU rows."""
        if self.gpu is None:
            return GpuRows()
        try:
            found = self.gpu.sample(ts_start, ts_end)
        except Exception as exc:  # an NVML or driver surprise must not cost the interval
            found = GpuRows(error=f"GPU sampling failed: {type(exc).__name__}: {exc}")
        if found.error != self._gpu_error:
            if found.error is not None:
                print(f"ingero trace: GPU rows: {found.error}", file=sys.stderr)
            elif self._gpu_error is not None:
                print("ingero trace: GPU rows: reading again", file=sys.stderr)
            self._gpu_error = found.error
        return found

    def _process_row(self, pid: object, now: float) -> dict[str, object] | None:
        if not isinstance(pid, int):
            return None
        tag = self.tags.get(pid)
        comm = exe = None
        try:
            comm = (self.proc / str(pid) / "comm").read_text().strip()
            exe = os.readlink(self.proc / str(pid) / "exe")
        except OSError:
            pass
        return {
            "pid": pid,
            "comm": comm,
            "exe": exe,
            "job_id": tag.job_id,
            "rank": tag.rank,
            "first_seen": self._known.get(pid, now),
            "last_seen": now,
        }


def system_libraries(find: Callable[[str], str | None]) -> list[LibraryFile]:
    """Libraries the dynamic linker would load (ldconfig cache), so new processes are caught."""
    out = []
    for kind, name in ((CUDART, "cudart"), (CUDA, "cuda"), (NCCL, "nccl")):
        path = find(name)
        if not path:
            continue
        try:
            st = os.stat(path)
        except OSError:
            continue
        out.append(LibraryFile(kind, os.path.realpath(path), st.st_dev, st.st_ino))
    return out
