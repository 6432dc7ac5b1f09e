"""``ingero gpu-sample``: its loop writes GPU rows through the node DB writer; a host with no
NVML library and no nvidia-smi gets one line and exit 69."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from ingero.cli.gpu_sample import run_loop
from ingero.cli.main import main
from ingero.collectors.nvml import NvmlReader
from ingero.nodedb.schema import connect
from ingero.nodedb.writer import NodeDbWriter
from ingero.runtime.clock import ManualClock
from ingero.trace.gpusampler import GpuSampler
from ingero.trace.tags import TagCache
from tests.unit.fake_pynvml import Fail, FakeNvml, healthy_h100


class StopAfter(threading.Event):
    """An event whose wait() returns True after ``n`` waits, advancing the clock on each."""

    def __init__(
        self, n: int, clock: ManualClock, step: float, hook: Callable[[int], None] | None = None
    ) -> None:
        super().__init__()
        self.left, self.clock, self.step, self.hook = n, clock, step, hook

    def wait(self, timeout: float | None = None) -> bool:
        if self.left == 0:
            return True
        if self.hook is not None:
            self.hook(self.left)
        self.left -= 1
        self.clock.advance(self.step)
        return False


def test_loop_writes_a_row_per_gpu_per_interval(tmp_path: Path) -> None:
    clock = ManualClock()
    fake = FakeNvml([healthy_h100(), healthy_h100(memory=Fail(3))])
    sampler = GpuSampler(NvmlReader(fake, clock=clock), None, tags=TagCache(proc=tmp_path))
    writer = NodeDbWriter(tmp_path / "node.db")
    written = run_loop(sampler, writer, clock, 1.0, StopAfter(3, clock, 1.0))
    writer.close()
    assert written == 3
    db = connect(tmp_path / "node.db", readonly=True)
    rows = db.execute(
        "SELECT gpu, COUNT(*), SUM(ts_end - ts_start), MAX(mem_total_bytes) FROM gpu_intervals"
        " GROUP BY gpu"
    ).fetchall()
    # GPU 1's memory is "not supported": NULL, not 0.
    assert rows == [(0, 3, 3.0, 85_520_809_984), (1, 3, 3.0, None)]
    assert db.execute("SELECT COUNT(*) FROM gpu_processes").fetchone()[0] == 6


def test_loop_logs_a_gpu_problem_once_and_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = ManualClock()
    fake = FakeNvml([healthy_h100()], init=Fail(9))  # driver not loaded
    sampler = GpuSampler(NvmlReader(fake, clock=clock, retry_s=2.5), None)
    writer = NodeDbWriter(tmp_path / "node.db")

    def driver_loads_after_three_intervals(left: int) -> None:
        if left == 3:
            fake.init = None

    stop = StopAfter(6, clock, 1.0, driver_loads_after_three_intervals)
    written = run_loop(sampler, writer, clock, 1.0, stop)
    writer.close()
    assert 1 <= written <= 3
    assert capsys.readouterr().err.count("the NVIDIA driver is not loaded") == 1


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="nvidia-smi is installed")
def test_no_nvml_library_and_no_nvidia_smi_is_exit_69_without_a_db(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reading = NvmlReader().read()
    if reading.error is None:
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(SystemExit) as info:
        main(["gpu-sample", "--db", str(tmp_path / "node.db")])
    assert info.value.code == 69
    err = capsys.readouterr().err.strip()
    assert err.startswith("ingero: no GPU:") and err.endswith("nvidia-smi is not installed")
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "node.db").exists()
