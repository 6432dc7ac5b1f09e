"""tracer: the loop over a stand-in probe set (the real one needs root; see integration)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ingero.nodedb.writer import Batch
from ingero.runtime.clock import ManualClock
from ingero.trace.aggregate import Snapshot, StatVal, slot_of
from ingero.trace.decode import (
    EVENT_FORMAT,
    KIND_CALL,
    KIND_COMM_INIT,
    KIND_ENTER,
    KIND_EXIT,
    KIND_NEW,
)
from ingero.trace.ops import OP_IDS
from ingero.trace.procmaps import LibraryFile
from ingero.trace.tags import TagCache
from ingero.trace.tracer import Tracer, system_libraries

OP = OP_IDS["cudaLaunchKernel"]


def _sample(pid: int, kind: int = KIND_CALL, ts: int = 0) -> bytes:
    return EVENT_FORMAT.pack(ts, 1000, 0, 0, 0, 0, pid, pid, OP, 35, -1, -1, 0, kind)


class FakeProbes:
    """Kernel state as plain dicts; ``pending`` samples arrive on the next poll."""

    def __init__(self) -> None:
        self.stats: dict[tuple[int, int], StatVal] = {}
        self.hist: dict[tuple[int, int], dict[int, int]] = {}
        self.pending: list[bytes] = []
        self.callback: Callable[[bytes], None] | None = None
        self.traced: list[int] = []
        self.forgotten: set[int] = set()
        self.budgets: list[float | None] = []

    def attach_library(self, lib: LibraryFile) -> list[Any]:
        return []

    def mark_traced(self, pids: list[int]) -> None:
        self.traced += pids

    def forget(self, pids: set[int]) -> None:
        self.forgotten |= pids
        for k in [k for k in self.stats if k[0] in pids]:
            del self.stats[k]

    def snapshot(self) -> tuple[Snapshot, dict[int, int]]:
        return Snapshot(dict(self.stats), {k: dict(v) for k, v in self.hist.items()}, {}), {}

    def open_ring(self, callback: Callable[[bytes], None]) -> None:
        self.callback = callback

    def poll(self, budget_s: float | None = None) -> None:
        self.budgets.append(budget_s)
        assert self.callback is not None
        for data in self.pending:
            self.callback(data)
        self.pending = []


class Sink:
    def __init__(self) -> None:
        self.batches: list[Batch] = []

    def submit(self, batch: Batch) -> bool:
        self.batches.append(batch)
        return True


def make_tracer(tmp_path: Path) -> tuple[Tracer, FakeProbes, Sink, ManualClock]:
    (tmp_path / "proc" / "42").mkdir(parents=True)
    (tmp_path / "proc" / "42" / "environ").write_bytes(b"SLURM_JOB_ID=8\0SLURM_PROCID=0\0")
    probes, sink, clock = FakeProbes(), Sink(), ManualClock()
    tags = TagCache(proc=tmp_path / "proc", job_dir=tmp_path / "jobs")
    tracer = Tracer(probes, sink, clock, tags, proc=tmp_path / "proc")
    tracer.start()
    return tracer, probes, sink, clock


def test_interval_rows_samples_and_exit_cleanup(tmp_path: Path) -> None:
    tracer, probes, sink, clock = make_tracer(tmp_path)
    probes.pending = [_sample(42, KIND_NEW)]
    tracer.pump()
    assert probes.traced == [42]  # tagged and traced as soon as it first called
    probes.stats[(42, OP)] = StatVal(100, 100_000, 100, 0)
    probes.hist[(42, OP)] = {slot_of(1000): 100}
    probes.pending = [_sample(42, ts=int(0.5e9))]
    clock.advance(1.0)
    result = tracer.tick()
    # The tick reads what waits for a bounded time only (a flood never holds it up).
    assert probes.budgets[-1] is not None and probes.budgets[-1] <= 0.1
    (row,) = result.intervals
    assert (row["pid"], row["op"], row["count"], row["job_id"], row["rank"]) == (
        42, "cudaLaunchKernel", 100, "8", 0)  # fmt: skip
    (raw,) = sink.batches[-1].raw_events
    # Kernel monotonic ns become wall-clock seconds: 0.5 s before "now" (monotonic 1.0).
    assert abs(float(raw["ts"]) - (clock.now() - 0.5)) < 1e-6  # type: ignore[arg-type]
    assert raw["ret"] == 35 and raw["job_id"] == "8"

    probes.stats[(42, OP)] = StatVal(150, 150_000, 150, 0)
    probes.hist[(42, OP)] = {slot_of(1000): 150}
    probes.pending = [_sample(42, KIND_EXIT)]
    clock.advance(1.0)
    (row,) = tracer.tick().intervals
    assert row["count"] == 50  # the last calls are written before the state is freed
    assert probes.forgotten == {42}
    clock.advance(1.0)
    assert tracer.tick().intervals == []


def test_nccl_arrivals_fill_the_nccl_tables_not_raw_events(tmp_path: Path) -> None:
    tracer, probes, sink, clock = make_tracer(tmp_path)
    ar = OP_IDS["ncclAllReduce"]

    def nccl(kind: int, ts: float, seq: int, op: int = ar) -> bytes:
        # ts, duration, bytes, hash, handle, seq, pid, tid, op, ret, rank, nranks, dtype, kind
        return EVENT_FORMAT.pack(int(ts * 1e9), 0, 4000, 0xAB, 0x7000, seq, 42, 43, op, 0, 1, 4,
                                 7, kind)  # fmt: skip

    probes.pending = [_sample(42, KIND_NEW), nccl(KIND_COMM_INIT, 0.1, 0, OP_IDS["ncclCommInitRank"]),
                      nccl(KIND_ENTER, 0.2, 1), nccl(KIND_CALL, 0.3, 1), nccl(KIND_ENTER, 0.6, 2)]  # fmt: skip
    clock.advance(1.0)
    tracer.tick()
    batch = sink.batches[-1]
    # One raw event per call (at its return), plus the init; arrivals only feed the fold.
    assert [r["op"] for r in batch.raw_events] == ["ncclCommInitRank", "ncclAllReduce"]
    (comm,) = batch.nccl_comms
    now = clock.now()  # the kernel's monotonic 1.0 s
    assert (comm["comm_hash"], comm["job_id"], comm["rank"], comm["comm_rank"]) == (
        "00000000000000ab", "8", 0, 1)  # fmt: skip
    assert (comm["entered_seq"], comm["returned_seq"], comm["inflight_seq"]) == (2, 1, 2)
    assert abs(float(comm["inflight_since"]) - (now - 0.4)) < 1e-6  # type: ignore[arg-type]
    (call,) = batch.nccl_calls  # seq 2 is still in flight: written with its return
    assert (call["seq"], call["bytes"]) == (1, 4000)
    assert abs(float(call["ts_enter"]) - (now - 0.8)) < 1e-6  # type: ignore[arg-type]

    # Still in flight a whole interval later: written in flight, then completed in place.
    clock.advance(1.0)
    tracer.tick()
    (hung,) = sink.batches[-1].nccl_calls
    assert (hung["seq"], hung["ts_return"], sink.batches[-1].nccl_returns) == (2, None, [])
    probes.pending = [nccl(KIND_CALL, 2.5, 2)]
    clock.advance(1.0)
    tracer.tick()
    (done,) = sink.batches[-1].nccl_returns
    assert (done["seq"], done["ts_enter"], done["ret"]) == (2, hung["ts_enter"], 0)
    assert sink.batches[-1].nccl_calls == []
    # The stop's last interval writes the call it finds in flight (not held for the next).
    probes.pending = [nccl(KIND_ENTER, 3.2, 3)]
    clock.advance(1.0)
    tracer.tick(final=True)
    assert [(c["seq"], c["ts_return"]) for c in sink.batches[-1].nccl_calls] == [(3, None)]


def test_bad_samples_are_counted_and_the_loop_goes_on(tmp_path: Path) -> None:
    tracer, probes, sink, clock = make_tracer(tmp_path)
    probes.pending = [b"short", _sample(42, kind=77), _sample(42)]
    clock.advance(1.0)
    result = tracer.tick()
    assert result.bad_samples == 2
    assert result.samples == 1
    assert len(sink.batches[-1].raw_events) == 1


def test_system_libraries(tmp_path: Path) -> None:
    lib = tmp_path / "libcudart.so.13"
    lib.write_bytes(b"")
    found = {"cudart": str(lib), "cuda": str(tmp_path / "missing.so")}
    libs = system_libraries(lambda name: found.get(name))
    assert [(x.kind, x.path) for x in libs] == [("cudart", str(lib))]


def test_every_tick_writes_a_gpu_row_per_gpu_with_its_processes_job(tmp_path: Path) -> None:
    import pynvml

    from ingero.collectors.nvml import NvmlReader
    from ingero.nodedb.schema import connect
    from ingero.nodedb.writer import write_batch
    from ingero.trace.gpusampler import GpuSampler
    from tests.unit.fake_pynvml import FakeNvml, healthy_h100

    (tmp_path / "proc" / "4242").mkdir(parents=True)
    (tmp_path / "proc" / "4242" / "environ").write_bytes(b"SLURM_JOB_ID=77\0SLURM_PROCID=5\0")
    fake = FakeNvml(
        [healthy_h100(), healthy_h100(processes=[], utilization=0)],
        events=[(1, pynvml.nvmlEventTypeXidCriticalError, 79)],
    )
    gpus = GpuSampler(
        NvmlReader(fake), None, tags=TagCache(proc=tmp_path / "proc", job_dir=tmp_path / "j")
    )
    probes, sink, clock = FakeProbes(), Sink(), ManualClock()
    tracer = Tracer(probes, sink, clock, TagCache(proc=tmp_path / "proc"), gpu=gpus)
    tracer.start()
    clock.advance(1.0)
    assert tracer.tick().gpus == 2
    db = connect(":memory:")
    write_batch(db, sink.batches[-1])
    rows = db.execute(
        "SELECT gpu, ts_end - ts_start, busy_ns, xid_count, xids, source FROM gpu_intervals"
        " ORDER BY gpu"
    ).fetchall()
    assert rows == [(0, 1.0, 970_000_000, 0, None, "nvml"), (1, 1.0, 0, 1, "[79]", "nvml")]
    assert db.execute("SELECT gpu, pid, job_id, rank FROM gpu_processes").fetchall() == [
        (0, 4242, "77", 5)
    ]


def test_a_failing_gpu_sampler_costs_the_gpu_rows_only(tmp_path: Path, capsys: Any) -> None:
    class Broken:
        def sample(self, ts_start: float, ts_end: float) -> Any:
            raise RuntimeError("driver went away")

    probes, sink, clock = FakeProbes(), Sink(), ManualClock()
    tracer = Tracer(probes, sink, clock, TagCache(proc=tmp_path), gpu=Broken())
    tracer.start()
    for _ in range(3):
        clock.advance(1.0)
        assert tracer.tick().gpus == 0
    assert len(sink.batches) == 3
    # Logged once, not every interval.
    assert capsys.readouterr().err.count("driver went away") == 1
