"""nvidia-smi output parsing, table-driven over captured outputs, and the runner's edges."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ingero.collectors.gpu import GpuInfo, NoGpu, NvidiaSmi, interpret, parse_query_output

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "collectors" / "nvidia-smi"


def free_share(gpus: tuple[GpuInfo, ...]) -> float | None:
    """The free share of the memory of the GPUs whose free and total were both parsed."""
    pairs = [
        (g.mem_free_mib, g.mem_total_mib)
        for g in gpus
        if g.mem_free_mib is not None and g.mem_total_mib
    ]
    if not pairs:
        return None
    return sum(f or 0.0 for f, _ in pairs) / sum(t or 0.0 for _, t in pairs)


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize(
    ("name", "returncode", "gpus", "mem_free", "error"),
    [
        ("h100x2.txt", 0, 2, (61234 + 20389) / (2 * 81559), None),
        ("na-fields.txt", 0, 2, 10240 / 40960, None),
        ("all-na.txt", 0, 1, None, None),
        ("gpu-lost.txt", 0, 1, None, None),
        ("no-driver.txt", 9, 0, None, "nvidia-smi exited 9: NVIDIA-SMI has failed"),
        ("no-devices.txt", 6, 0, None, "no GPU: nvidia-smi found no devices"),
        ("garbage.txt", 2, 0, None, "nvidia-smi exited 2: Field"),
        ("garbage.txt", 0, 0, None, "unexpected nvidia-smi output"),
    ],
)
def test_interpret_captured_outputs(
    name: str, returncode: int, gpus: int, mem_free: float | None, error: str | None
) -> None:
    status = interpret(returncode, fixture(name), "")
    assert len(status.gpus) == gpus
    if mem_free is None:
        assert free_share(status.gpus) is None
    else:
        assert free_share(status.gpus) == pytest.approx(mem_free)
    if error is None:
        assert status.error is None
    else:
        assert status.error is not None and status.error.startswith(error)


def test_na_and_not_supported_fields_become_none() -> None:
    gpus = parse_query_output(fixture("na-fields.txt"))
    assert gpus[0] == GpuInfo(0, "NVIDIA A100-SXM4-40GB", None, 40960.0, None)
    assert gpus[1] == GpuInfo(1, "NVIDIA A100-SXM4-40GB", 10240.0, 40960.0, None)


def test_empty_output_is_no_gpu() -> None:
    assert interpret(0, "", "").error == "no GPU: nvidia-smi listed none"


def test_error_on_stderr_is_reported() -> None:
    status = interpret(255, "", "Failed to initialize NVML: Driver/library version mismatch\n")
    assert status.error == (
        "nvidia-smi exited 255: Failed to initialize NVML: Driver/library version mismatch"
    )


@pytest.mark.parametrize("text", ["0, name, 1, 2\n", "x, name, 1, 2, 3\n", "0, name, lots, 2, 3\n"])
def test_malformed_lines_are_errors_not_gpus(text: str) -> None:
    status = interpret(0, text, "")
    assert status.gpus == ()
    assert status.error is not None and status.error.startswith("unexpected nvidia-smi output")


def _fake(tmp_path: Path, body: str) -> str:
    script = tmp_path / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


def test_runs_the_binary_with_the_query(tmp_path: Path) -> None:
    args_file = tmp_path / "args"
    binary = _fake(tmp_path, f'echo "$@" > {args_file}; cat {FIXTURES / "h100x2.txt"}')
    status = NvidiaSmi(binary).query()
    assert status.error is None and len(status.gpus) == 2
    assert args_file.read_text().split() == [
        "--query-gpu=index,name,memory.free,memory.total,utilization.gpu",
        "--format=csv,noheader,nounits",
    ]


def test_failing_binary(tmp_path: Path) -> None:
    binary = _fake(tmp_path, f"cat {FIXTURES / 'no-driver.txt'}; exit 9")
    status = NvidiaSmi(binary).query()
    assert status.error is not None and status.error.startswith("nvidia-smi exited 9")


def test_hanging_binary_times_out(tmp_path: Path) -> None:
    binary = _fake(tmp_path, "exec sleep 5")
    status = NvidiaSmi(binary, timeout_s=0.2).query()
    assert status.error == "nvidia-smi did not answer within 0.2 s"


def test_absent_binary_is_no_gpu(tmp_path: Path) -> None:
    status = NvidiaSmi(str(tmp_path / "nope")).query()
    assert status.error is not None and status.error.startswith("no GPU")
    assert NoGpu().query().gpus == ()


@pytest.mark.skipif(not os.path.exists("/dev/nvidia0"), reason="no NVIDIA GPU on this host")
def test_real_nvidia_smi() -> None:
    status = NvidiaSmi().query()
    assert status.error is None and status.gpus


def test_fallback_query_uses_the_first_that_answers() -> None:
    from ingero.collectors.gpu import FallbackQuery, GpuStatus

    class Fixed:
        def __init__(self, status: GpuStatus) -> None:
            self.status = status

        def query(self) -> GpuStatus:
            return self.status

    good = GpuStatus(gpus=(GpuInfo(0, "H100", 1.0, 2.0, 3.0),))
    assert FallbackQuery(Fixed(GpuStatus(error="no NVML")), Fixed(good)).query() == good
    assert FallbackQuery(NoGpu(), Fixed(GpuStatus(error="smi broke"))).query().error == "smi broke"
