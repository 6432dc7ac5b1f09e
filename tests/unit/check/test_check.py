"""ingero check: each check against fixture hosts, and the exit code."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingero.check.checks import (
    FAIL,
    INFO,
    OK,
    WARN,
    Host,
    Result,
    check_gpu,
    check_headers,
    check_kernel,
    check_library,
    check_permissions,
    check_slurm,
    check_tracefs,
    check_uprobes,
    effective_caps,
    library_version,
)
from ingero.trace.facilities import Facilities


def _host(tmp_path: Path, **kw: object) -> Host:
    defaults: dict[str, object] = {"root": tmp_path, "release": "6.1.0-18-amd64", "euid": 0,
                                   "run": lambda argv: None, "which": lambda name: None}  # fmt: skip
    defaults.update(kw)
    return Host(**defaults)  # type: ignore[arg-type]


def test_kernel_version_and_btf(tmp_path: Path) -> None:
    kernel, btf = check_kernel(_host(tmp_path))
    assert kernel.status == OK and btf.status == WARN and btf.fix
    old, _ = check_kernel(_host(tmp_path, release="4.19.0-1"))
    assert old.status == FAIL and old.blocks_tracing and "5.8" in old.fix


def test_permissions(tmp_path: Path) -> None:
    assert check_permissions(_host(tmp_path)).status == OK
    status = tmp_path / "proc/self/status"
    status.parent.mkdir(parents=True)
    status.write_text("Name:\tx\nCapEff:\t0000000000000000\n")
    denied = check_permissions(_host(tmp_path, euid=1000))
    assert denied.status == FAIL and "CAP_BPF" in denied.fix
    status.write_text(f"CapEff:\t{(1 << 39) | (1 << 38):016x}\n")
    assert check_permissions(_host(tmp_path, euid=1000)).status == OK
    assert effective_caps("nothing") == 0


def test_tracefs(tmp_path: Path) -> None:
    assert check_tracefs(_host(tmp_path)).status == FAIL
    (tmp_path / "sys/kernel/tracing/events").mkdir(parents=True)
    assert check_tracefs(_host(tmp_path)).status == OK


def test_headers_missing_then_stand_in(tmp_path: Path) -> None:
    missing = check_headers(_host(tmp_path, release="6.18.1-custom"))
    assert missing.status == FAIL and "linux-headers" in missing.fix
    other = tmp_path / "usr/src/linux-headers-6.1.0-56-amd64"
    (other / "include").mkdir(parents=True)
    (tmp_path / "lib/modules/6.18.1-custom").mkdir(parents=True)
    (tmp_path / "lib/modules/6.18.1-custom/build").symlink_to(other)
    found = check_headers(_host(tmp_path, release="6.18.1-custom"))
    assert found.status == OK and "stand-in" in found.detail


def test_libraries_from_the_ldconfig_cache(tmp_path: Path) -> None:
    lib = tmp_path / "libcudart.so.12.4.127"
    lib.write_bytes(b"")
    (tmp_path / "libcudart.so.12").symlink_to(lib)
    cache = (f"\tlibcudart.so.12 (libc6,x86-64) => {tmp_path}/libcudart.so.12\n"
             "\tlibc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6\n")  # fmt: skip
    host = _host(tmp_path, run=lambda argv: cache if argv[0] == "ldconfig" else None)
    found = check_library(host, "cudart", "CUDA runtime", "fix")
    assert found.status == OK and "12.4.127" in found.detail
    assert check_library(host, "nccl", "NCCL", "install nccl").status == WARN
    assert library_version("/x/libnccl.so.2.21.5") == "2.21.5"


def test_gpu_and_slurm(tmp_path: Path) -> None:
    smi = "NVIDIA H100 80GB HBM3, 550.54.15\nNVIDIA H100 80GB HBM3, 550.54.15\n"
    gpu = check_gpu(_host(tmp_path, run=lambda argv: smi if argv[0] == "nvidia-smi" else None))
    assert gpu.status == OK and gpu.detail.startswith("2 GPU(s)")
    assert check_gpu(_host(tmp_path)).status == INFO
    assert check_slurm(_host(tmp_path)).status == INFO
    assert check_slurm(_host(tmp_path, which=lambda n: f"/usr/bin/{n}")).status == OK


def test_cli_exit_code_says_whether_tracing_can_run(capsys: pytest.CaptureFixture[str]) -> None:
    from ingero.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["check", "--db", "/proc/no/such/dir/ingero.db", "--json"])
    assert exc.value.code == 69
    out = capsys.readouterr().out
    assert '"can_trace": false' in out and "node DB" in out


def _facilities(release: str, **kw: object) -> Facilities:
    base: dict[str, object] = dict(release=release, uprobe_multi=True, uprobe_multi_why="links ok",
                                   sessions=True, sessions_why="sessions ok",
                                   uretprobe_syscall=True)  # fmt: skip
    base.update(kw)
    return Facilities(**base)  # type: ignore[arg-type]


def _uprobes(tmp_path: Path, release: str, **kw: object) -> dict[str, Result]:
    host = _host(tmp_path, release=release)
    results = check_uprobes(host, lambda rel: _facilities(rel, **kw))
    return {r.name: r for r in results}


def test_uprobes_on_a_kernel_with_sessions_and_the_seccomp_fix(tmp_path: Path) -> None:
    got = _uprobes(tmp_path, "6.18.44")
    assert [got[n].status for n in ("uprobe_multi links", "uprobe sessions",
                                    "uretprobe syscall")] == [OK, OK, OK]  # fmt: skip
    assert got["launch mode"].detail.startswith("sampled: uprobe sessions")
    assert not any(r.blocks_tracing for r in got.values())


def test_the_seccomp_hazard_is_a_warning_with_the_fix(tmp_path: Path) -> None:
    """6.12.13: the uretprobe syscall without the seccomp pass-through, no sessions."""
    got = _uprobes(tmp_path, "6.12.13-amd64", sessions=False, sessions_why="no session type")
    hazard = got["uretprobe syscall"]
    assert hazard.status == WARN and "cf6cb56ef244" in hazard.detail and "seccomp" in hazard.fix
    assert got["uprobe sessions"].status == INFO and "6.13" in got["uprobe sessions"].fix
    assert got["launch mode"].detail == (
        "all: no uprobe sessions: no session type: every launch takes its return probe"
    )
    assert not any(r.blocks_tracing for r in got.values())


@pytest.mark.parametrize(("syscall", "status"), [(False, OK), (None, INFO)])
def test_no_uretprobe_syscall_or_no_btf_to_tell(
    tmp_path: Path, syscall: bool | None, status: str
) -> None:
    assert _uprobes(tmp_path, "6.12.1", uretprobe_syscall=syscall)["uretprobe syscall"].status == (
        status
    )
