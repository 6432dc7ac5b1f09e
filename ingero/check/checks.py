"""Host checks for ``ingero check``: each returns a result with a fix hint.

Every probe of the host (files, environment, commands) goes through ``Host`` so tests run
the checks against fixture trees and canned command output.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ingero.trace import facilities
from ingero.trace.bccload import BccUnavailable, find_bcc_dir, load_bcc
from ingero.trace.facilities import Facilities
from ingero.trace.ops import LIB_STEMS
from ingero.trace.procmaps import scan, unique_libraries

OK, WARN, FAIL, INFO = "ok", "warn", "fail", "info"
CAP_PERFMON, CAP_BPF, CAP_SYS_ADMIN = 38, 39, 21
MIN_KERNEL = (5, 8)  # BPF ring buffer


@dataclass(frozen=True)
class Result:
    name: str
    status: str  # ok | warn | fail | info
    detail: str
    fix: str = ""
    required: bool = False

    @property
    def blocks_tracing(self) -> bool:
        return self.required and self.status == FAIL


def _run(argv: list[str], timeout: float = 5.0) -> str | None:
    """A command's stdout, or None when it is missing, fails or hangs."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


@dataclass
class Host:
    """Where the checks look; the defaults are the real machine."""

    root: Path = Path("/")
    release: str = field(default_factory=platform.release)
    euid: int = field(default_factory=os.geteuid)
    run: Callable[[list[str]], str | None] = _run
    which: Callable[[str], str | None] = shutil.which

    def path(self, p: str) -> Path:
        return self.root / p.lstrip("/")


def check_kernel(host: Host) -> list[Result]:
    version = facilities.parse_version(host.release)[:2]
    ok = version >= MIN_KERNEL
    out = [
        Result(
            "kernel", OK if ok else FAIL, host.release,
            "" if ok else "upgrade to Linux 5.8 or newer (BPF ring buffer)", required=True,
        ),
    ]  # fmt: skip
    btf = host.path("/sys/kernel/btf/vmlinux").exists()
    out.append(
        Result(
            "BTF", OK if btf else WARN,
            "/sys/kernel/btf/vmlinux present" if btf else "no kernel BTF",
            "" if btf else "not needed by ingero (BCC compiles against headers); "
            "build the kernel with CONFIG_DEBUG_INFO_BTF=y for other BPF tools",
        )
    )  # fmt: skip
    return out


def check_uprobes(
    host: Host, probe: Callable[[str], Facilities] = facilities.probe
) -> list[Result]:
    """The kernel's uprobe facilities (links, sessions, the uretprobe syscall), the seccomp
    hazard, and the launch mode ``ingero trace`` runs in, with why."""
    fac = probe(host.release)
    out = [
        Result("uprobe_multi links", OK if fac.uprobe_multi else INFO, fac.uprobe_multi_why,
               "" if fac.uprobe_multi else "Linux 6.6+: a stop in about a second, not 0.1 s "
               "a probe"),
        Result("uprobe sessions", OK if fac.sessions else INFO, fac.sessions_why,
               "" if fac.sessions else "Linux 6.13+: launches counted at entry, a sample "
               "timed (until then every launch takes a return probe)"),
    ]  # fmt: skip
    if fac.uretprobe_syscall is None:
        out.append(Result("uretprobe syscall", INFO, "unknown (no kernel BTF to tell)"))
    elif not fac.uretprobe_syscall:
        out.append(Result("uretprobe syscall", OK, "absent: return probes trap as before 6.11"))
    elif fac.seccomp_hazard:
        out.append(
            Result(
                "uretprobe syscall", WARN,
                f"present, and {host.release} predates the fix that lets it through seccomp "
                f"filters ({facilities.SECCOMP_FIX}: 6.12.14, 6.13.3, 6.14): a traced process "
                "under a seccomp filter that does not allow it (containers) is killed at a "
                "traced call's return",
                "upgrade the kernel (or check that the distribution kernel carries "
                f"{facilities.SECCOMP_FIX}), or allow the uretprobe syscall (335) in the "
                "job's seccomp profile",
            )
        )  # fmt: skip
    else:
        out.append(Result("uretprobe syscall", OK,
                          "present; seccomp filters let it through (6.12.14, 6.13.3, 6.14+)"))  # fmt: skip
    mode, why = fac.launch_mode()
    out.append(Result("launch mode", INFO, f"{mode}: {why}"))
    return out


def effective_caps(status_text: str) -> int:
    m = re.search(r"^CapEff:\s*([0-9a-fA-F]+)", status_text, re.MULTILINE)
    return int(m.group(1), 16) if m else 0


def check_permissions(host: Host) -> Result:
    if host.euid == 0:
        return Result("BPF permissions", OK, "running as root", required=True)
    try:
        caps = effective_caps(host.path("/proc/self/status").read_text())
    except OSError:
        caps = 0
    has = {n for n, bit in (("CAP_BPF", CAP_BPF), ("CAP_PERFMON", CAP_PERFMON),
                            ("CAP_SYS_ADMIN", CAP_SYS_ADMIN)) if caps >> bit & 1}  # fmt: skip
    if {"CAP_BPF", "CAP_PERFMON"} <= has or "CAP_SYS_ADMIN" in has:
        return Result("BPF permissions", OK, ", ".join(sorted(has)), required=True)
    return Result(
        "BPF permissions", FAIL, f"uid {host.euid} without CAP_BPF+CAP_PERFMON",
        "run as root, or grant AmbientCapabilities=CAP_BPF CAP_PERFMON in the unit",
        required=True,
    )  # fmt: skip


def check_tracefs(host: Host) -> Result:
    for p in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing"):
        if host.path(p + "/events").is_dir():
            return Result("tracefs", OK, f"{p} mounted", required=True)
    return Result(
        "tracefs", FAIL, "tracefs not mounted",
        "mount -t tracefs tracefs /sys/kernel/tracing", required=True,
    )  # fmt: skip


def check_bcc(host: Host, load: Callable[[], object] = load_bcc) -> Result:
    fix = "apt-get install python3-bpfcc libbpfcc (Debian's; never the PyPI package 'bcc')"
    if find_bcc_dir() is None:
        return Result("BCC", FAIL, "python3-bpfcc not installed", fix, required=True)
    try:
        module = load()
    except BccUnavailable as exc:
        return Result("BCC", FAIL, str(exc), fix, required=True)
    version = getattr(module, "__version__", "?")
    return Result("BCC", OK, f"bcc {version} from {find_bcc_dir()}", required=True)


def check_headers(host: Host) -> Result:
    build = host.path(f"/lib/modules/{host.release}/build")
    if host.path("/sys/kernel/kheaders.tar.xz").exists():
        return Result("kernel headers", OK, "in-kernel headers (kheaders)", required=True)
    if (build / "include").is_dir():
        target = os.path.realpath(build)
        note = "" if host.release in target else " (stand-in: another kernel's headers)"
        return Result("kernel headers", OK, f"{build} → {target}{note}", required=True)
    return Result(
        "kernel headers", FAIL, f"{build} missing",
        f"apt-get install linux-headers-{host.release} (custom kernel: install "
        "linux-headers-amd64 and link it to that path; tests/setup-host.sh does)",
        required=True,
    )  # fmt: skip


def library_version(path: str) -> str:
    """``…/libcudart.so.13.0.96`` → ``13.0.96`` (from the real file name)."""
    name = os.path.basename(os.path.realpath(path))
    _, _, version = name.partition(".so.")
    return version or "?"


def find_libraries(host: Host, kind: str) -> list[str]:
    """Paths of one library kind: ldconfig's cache plus whatever running processes map."""
    stem = LIB_STEMS[kind]
    found: list[str] = []
    cache = host.run(["ldconfig", "-p"]) or ""
    for line in cache.splitlines():
        name, _, path = line.strip().partition(" => ")
        if name.split(" ")[0].startswith(stem) and path:
            found.append(path.strip())
    for lib in unique_libraries(scan(proc=host.path("/proc"))):
        if lib.kind == kind:
            found.append(lib.path)
    seen: dict[str, str] = {}
    for p in found:
        seen.setdefault(os.path.realpath(p), p)
    return sorted(seen)


def check_library(host: Host, kind: str, label: str, fix: str) -> Result:
    paths = find_libraries(host, kind)
    if not paths:
        return Result(label, WARN, "not found", fix)
    return Result(label, OK, "; ".join(f"{p} ({library_version(p)})" for p in paths))


def check_gpu(host: Host) -> Result:
    out = host.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    if out and out.strip():
        gpus = [g.strip() for g in out.strip().splitlines()]
        return Result("GPU", OK, f"{len(gpus)} GPU(s): {'; '.join(gpus)}")
    version = host.path("/proc/driver/nvidia/version")
    if version.exists():
        return Result("GPU", WARN, "NVIDIA driver loaded, nvidia-smi unavailable",
                      "install the NVIDIA utilities for GPU names")  # fmt: skip
    return Result("GPU", INFO, "no GPU (no NVIDIA driver): CUDA calls are still traced")


def check_slurm(host: Host) -> Result:
    tools = [t for t in ("slurmd", "scontrol") if host.which(t)]
    if tools:
        return Result("Slurm", OK, f"found {', '.join(tools)}: job tags from the environment")
    return Result("Slurm", INFO, "not installed: processes are traced without job tags")


def check_db(host: Host, db_path: Path) -> Result:
    from ingero.nodedb.schema import connect

    try:
        db_path.parent.mkdir(parents=True, exist_ok=True)
        db = connect(db_path)
        db.conn.close()
    except Exception as exc:
        return Result(
            "node DB", FAIL, f"{db_path}: {exc}",
            f"make {db_path.parent} writable for this user or pass --db", required=True,
        )  # fmt: skip
    return Result("node DB", OK, f"{db_path} writable", required=True)


def run_all(host: Host, db_path: Path) -> list[Result]:
    results = check_kernel(host)
    results += [
        check_permissions(host),
        *check_uprobes(host),
        check_tracefs(host),
        check_bcc(host),
        check_headers(host),
        check_library(host, "cudart", "CUDA runtime",
                      "install the CUDA toolkit or a framework that bundles libcudart"),
        check_library(host, "cuda", "CUDA driver library",
                      "install the NVIDIA driver (libcuda.so) on GPU nodes"),
        check_library(host, "nccl", "NCCL", "install libnccl2 or the nvidia-nccl wheel for "
                      "multi-GPU jobs"),
        check_gpu(host),
        check_slurm(host),
        check_db(host, db_path),
    ]  # fmt: skip
    return results
