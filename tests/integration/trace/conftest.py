"""Fixtures for the tracer's integration tests: real BPF, real libcudart, real libnccl."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.python314 import fetch as python314

HERE = Path(__file__).parent
REPO = HERE.parents[2]
CUDA_HOME = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
NCCL_WHEEL = "nvidia-nccl-cu13"


def interpreters(minor_from: int = 10) -> list[Any]:
    """This test run's Python, Debian's 3.11, the first pyenv install of each of 3.10, 3.12
    and 3.13 present here (from ``minor_from`` on), and Debian sid's 3.14 (tests/python314:
    downloaded once; its cases skip with the reason when it cannot be had)."""
    found = [sys.executable, "/usr/bin/python3.11"]
    for minor in (10, 12, 13):
        if minor >= minor_from:
            found += [str(p) for p in sorted(
                Path.home().glob(f".pyenv/versions/3.{minor}.*/bin/python3.{minor}"))[:1]]  # fmt: skip
    out: list[Any] = [p for p in found if os.access(p, os.X_OK)]
    py314 = python314.ensure()
    if isinstance(py314, Path):
        out.append(str(py314))
    else:
        out.append(pytest.param("python3.14", marks=pytest.mark.skip(reason=py314)))
    return out


@pytest.fixture(scope="session")
def bpf_ready(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Skip unless ``ingero check`` says tracing can run here (root, BCC, headers, tracefs)."""
    db = tmp_path_factory.mktemp("check") / "node.db"
    out = subprocess.run(
        [sys.executable, "-m", "ingero.cli.main", "check", "--json", "--db", str(db)],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
    )  # fmt: skip
    try:
        report = json.loads(out.stdout)
    except ValueError:
        pytest.fail(f"ingero check --json printed no JSON: {out.stdout!r} {out.stderr!r}")
    if not report["can_trace"]:
        missing = [f"{c['name']}: {c['detail']}" for c in report["checks"]
                   if c["required"] and c["status"] == "fail"]  # fmt: skip
        pytest.skip("BPF tracing cannot run here: " + "; ".join(missing))


def _gcc(src: Path, out: Path, *flags: str) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed (tests/apt-packages.txt lists it)")
    subprocess.run(["gcc", "-O1", "-o", str(out), str(src), *flags], check=True, timeout=120)
    return out


@pytest.fixture(scope="session")
def cuda_loop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/integration/trace/cuda_loop.c built against the toolkit's shared libcudart."""
    lib = CUDA_HOME / "lib64"
    if (
        not (lib / "libcudart.so").exists()
        or not (CUDA_HOME / "include/cuda_runtime_api.h").exists()
    ):
        pytest.skip(f"no CUDA toolkit with a shared libcudart under {CUDA_HOME}")
    out = tmp_path_factory.mktemp("cuda") / "cuda_loop"
    # A byte-identical copy of the real libcudart, a file of its own: another tracer's uprobes
    # on the toolkit's file (CI runs the packaged ingero-trace beside these tests) make the
    # kernel refuse some of this test's attaches there (EINVAL), whatever the code under test
    # does. The tests that want a foreign probe start their own (the holder).
    private = out.parent / "lib"
    private.mkdir()
    real = Path(os.path.realpath(lib / "libcudart.so"))
    shutil.copy2(real, private / real.name)
    for name in ("libcudart.so", "libcudart.so.13"):
        if name != real.name:
            (private / name).symlink_to(real.name)
    return _gcc(HERE / "cuda_loop.c", out, f"-I{CUDA_HOME}/include", f"-L{private}", "-lcudart",
                f"-Wl,-rpath,{private}")  # fmt: skip


def cudart_of(loop: Path) -> str:
    """The real path of the libcudart ``loop`` (the ``cuda_loop`` fixture) runs on."""
    return os.path.realpath(loop.parent / "lib" / "libcudart.so")


def _nccl_dir() -> Path:
    """The real libnccl from the nvidia-nccl-cu13 wheel, downloaded once into a cache."""
    if os.environ.get("INGERO_TEST_NCCL_DIR"):
        return Path(os.environ["INGERO_TEST_NCCL_DIR"])
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ingero-tests" / "nccl"
    if (cache / "lib" / "libnccl.so.2").exists():
        return cache
    download = cache.parent / "wheels"
    download.mkdir(parents=True, exist_ok=True)
    got = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", NCCL_WHEEL, "-d", str(download)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    wheels = sorted(download.glob("nvidia_nccl_cu13-*.whl"))
    if got.returncode != 0 or not wheels:
        pytest.skip(f"cannot download {NCCL_WHEEL} (~300 MB): {got.stderr.strip()[-300:]}")
    tmp = cache.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(wheels[-1]) as whl:
        for name in whl.namelist():
            if name.startswith(("nvidia/nccl/lib/libnccl.so", "nvidia/nccl/include/nccl.h")):
                whl.extract(name, tmp)
    if not cache.exists():
        (tmp / "nvidia/nccl").rename(cache)
    shutil.rmtree(tmp, ignore_errors=True)
    wheels[-1].unlink()  # the extracted library is what is kept
    return cache


@pytest.fixture(scope="session")
def nccl_loop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/integration/trace/nccl_loop.c built against the real libnccl."""
    nccl = _nccl_dir()
    out = tmp_path_factory.mktemp("nccl") / "nccl_loop"
    return _gcc(HERE / "nccl_loop.c", out, f"-I{nccl}/include", f"-I{CUDA_HOME}/include",
                f"-L{nccl}/lib", "-l:libnccl.so.2", f"-Wl,-rpath,{nccl}/lib")  # fmt: skip


class Notify:
    """A NOTIFY_SOCKET, as systemd gives a Type=notify service."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.messages: list[str] = []

    def wait_for(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                data = self.sock.recv(4096).decode()
            except TimeoutError:
                break
            self.messages.append(data)
            if any(line.startswith(prefix) for line in data.splitlines()):
                return data
        raise AssertionError(f"no {prefix} from the tracer; got {self.messages[-3:]}")

    def close(self) -> None:
        self.sock.close()


class TracerProc:
    def __init__(self, proc: subprocess.Popen[str], notify: Notify, db: Path) -> None:
        self.proc = proc
        self.notify = notify
        self.db = db

    def stop(self) -> tuple[int, str]:
        self.proc.terminate()
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return self.proc.returncode, err


@pytest.fixture
def start_tracer(tmp_path: Path, bpf_ready: None) -> Iterator[object]:
    """Start ``ingero trace --record`` (real BPF) and wait for READY=1; stopped by PID after."""
    started: list[TracerProc] = []

    def start(*args: str, interval: str = "0.3", db: Path | None = None) -> TracerProc:
        """``db``: the node DB to write (default: one per tracer in the test's directory)."""
        notify = Notify(tmp_path / f"notify{len(started)}.sock")
        # One node DB per tracer (several tracers in one test stand for several nodes).
        if db is None:
            db = tmp_path / ("node.db" if not started else f"node{len(started)}.db")
        env = dict(os.environ, NOTIFY_SOCKET=str(notify.path))
        proc = subprocess.Popen(
            [sys.executable, "-m", "ingero.cli.main", "trace", "--record", "--db", str(db),
             "--interval", interval, *args],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        tracer = TracerProc(proc, notify, db)
        started.append(tracer)
        try:
            notify.wait_for("READY=1", timeout=120)
        except AssertionError:
            code, err = tracer.stop()
            raise AssertionError(
                f"tracer never became ready (exit {code}): {err[-2000:]}"
            ) from None
        return tracer

    yield start
    for tracer in started:
        if tracer.proc.poll() is None:
            tracer.stop()
        tracer.notify.close()


def wait_rows(db: Path, sql: str, args: tuple[object, ...], want: int, notify: Notify) -> int:
    """Wait (tick by tick, up to 60 s) until ``sql`` returns at least ``want``."""
    value = 0
    for _ in range(200):
        notify.wait_for("WATCHDOG=1", timeout=30)
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            value = conn.execute(sql, args).fetchone()[0] or 0
        except sqlite3.OperationalError:
            value = 0
        finally:
            conn.close()
        if value >= want:
            return int(value)
    return int(value)


@pytest.fixture
def spawn() -> Iterator[object]:
    """Start workloads that wait for a line on stdin before their loop; killed by PID after."""
    procs: list[subprocess.Popen[str]] = []

    def start(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def finish(proc: subprocess.Popen[str]) -> dict[str, str]:
    """Release the workload, wait for it, and parse its ``name=value`` lines."""
    out, err = proc.communicate("go\n", timeout=120)
    assert proc.returncode == 0, err
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


@pytest.fixture(scope="session")
def nccl_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """nccl_ranks.c linked against fake_libnccl.c built as libnccl.so.2 (NCCL's real header:
    the stand-in has the real signatures), for multi-rank runs without GPUs."""
    nccl = _nccl_dir()
    out = tmp_path_factory.mktemp("fake_nccl")
    inc = [f"-I{nccl}/include", f"-I{CUDA_HOME}/include"]
    _gcc(HERE / "fake_libnccl.c", out / "libnccl.so.2", "-O0", "-shared", "-fPIC",
         "-Wl,-soname,libnccl.so.2", *inc)  # fmt: skip
    return _gcc(HERE / "nccl_ranks.c", out / "nccl_ranks", *inc, str(out / "libnccl.so.2"),
                f"-Wl,-rpath,{out}")  # fmt: skip


@pytest.fixture(scope="session")
def runtime_loop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runtime_loop.c against fake_libcudart.c (libcudart.so.13, the toolkit's real header),
    which calls into fake_libcuda.c (libcuda.so.1) inside each runtime call."""
    return _against_stand_ins(tmp_path_factory.mktemp("runtime"), "runtime_loop")


def _against_stand_ins(out: Path, program: str) -> Path:
    """``program``.c linked against fake_libcudart.c and fake_libcuda.c built into ``out``."""
    inc = f"-I{CUDA_HOME}/include"
    _gcc(HERE / "fake_libcuda.c", out / "libcuda.so.1", "-O0", "-shared", "-fPIC")
    _gcc(HERE / "fake_libcudart.c", out / "libcudart.so.13", "-O0", "-shared", "-fPIC", inc,
         "-Wl,-soname,libcudart.so.13", str(out / "libcuda.so.1"), f"-Wl,-rpath,{out}")  # fmt: skip
    return _gcc(HERE / f"{program}.c", out / program, inc, str(out / "libcudart.so.13"),
                str(out / "libcuda.so.1"), f"-Wl,-rpath,{out}")  # fmt: skip


@pytest.fixture(scope="session")
def driver_loop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """driver_loop.c linked against fake_libcuda.c built as libcuda.so.1 (no driver here).

    -O0 keeps identical function bodies at distinct addresses (no identical-code folding).
    """
    out = tmp_path_factory.mktemp("driver")
    _gcc(HERE / "fake_libcuda.c", out / "libcuda.so.1", "-O0", "-shared", "-fPIC")
    return _gcc(HERE / "driver_loop.c", out / "driver_loop", str(out / "libcuda.so.1"),
                f"-Wl,-rpath,{out}")  # fmt: skip


@pytest.fixture(scope="session")
def launch_ex(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """launch_ex.c against the toolkit's real libcudart and the stand-in libcuda (no driver
    here: the real runtime's launches fail at once, after their uprobes fired)."""
    lib = CUDA_HOME / "lib64"
    if not (lib / "libcudart.so").exists() or not (CUDA_HOME / "include/cuda.h").exists():
        pytest.skip(f"no CUDA toolkit with a shared libcudart and cuda.h under {CUDA_HOME}")
    out = tmp_path_factory.mktemp("launch_ex")
    _gcc(HERE / "fake_libcuda.c", out / "libcuda.so.1", "-O0", "-shared", "-fPIC")
    return _gcc(HERE / "launch_ex.c", out / "launch_ex", f"-I{CUDA_HOME}/include", f"-L{lib}",
                "-lcudart", f"-Wl,-rpath,{lib}", str(out / "libcuda.so.1"),
                f"-Wl,-rpath,{out}")  # fmt: skip


@pytest.fixture(scope="session")
def launch_mix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """launch_mix.c against the stand-in libcudart and libcuda (runtime_loop's build)."""
    return _against_stand_ins(tmp_path_factory.mktemp("launch_mix"), "launch_mix")


@pytest.fixture(scope="session")
def stream_engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """stream_engine.c against the stand-in libcudart and libcuda (runtime_loop's build)."""
    return _against_stand_ins(tmp_path_factory.mktemp("streams"), "stream_engine")
