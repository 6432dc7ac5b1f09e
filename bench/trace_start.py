"""How long the tracer takes to start: compile and load its program, attach, first host row.

Run as root: ``.venv/bin/python -m bench.trace_start`` (``--lib KIND:PATH`` as
``bench.trace_stop``; ``--repeat N``). For stacks on (the default) and off, median of
``--repeat``:

- compile: ``probes.load()``: BCC compiles bpf/ingero.bpf.c with clang and loads the
  host tracepoints (and, with stacks, the stack program the probes tail-call);
- attach: every op of the libraries attached (the kernel's verifier loads each probe
  program, then the uprobe_multi links); both also as this process's CPU time;
- ready and first row: ``ingero trace --record --db DB --pid P --interval 1`` on
  tests/integration/trace/cuda_loop.c (built here with gcc against the toolkit's
  libcudart, waiting before its first call): from the command's start to its ``READY=1``
  and to the first ``host_intervals`` row in its node DB (one interval after ready).
"""

from __future__ import annotations

import os
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.trace_stop import setup
from ingero.trace.probes import load
from ingero.trace.procmaps import LibraryFile

REPO = Path(__file__).resolve().parents[1]
CUDA_HOME = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))


def one_load(libs: list[LibraryFile], stacks: bool) -> tuple[float, float, float, float]:
    """(compile s, its CPU s, attach s, its CPU s) of one load. The CPU time (clang's, and
    the kernel's verifier's, both in this process) is what a busy machine does not
    stretch."""
    t0, c0 = time.monotonic(), time.process_time()
    probes = load(sample_every=64, stacks=stacks)
    t1, c1 = time.monotonic(), time.process_time()
    try:
        for lib in libs:
            probes.attach_library(lib)
        return t1 - t0, c1 - c0, time.monotonic() - t1, time.process_time() - c1
    finally:
        probes.close()


def build_workload(out: Path) -> Path:
    exe = out / "cuda_loop"
    lib = CUDA_HOME / "lib64"
    subprocess.run(
        ["gcc", "-O1", "-o", str(exe), str(REPO / "tests/integration/trace/cuda_loop.c"),
         f"-I{CUDA_HOME}/include", f"-L{lib}", "-lcudart", f"-Wl,-rpath,{lib}"],
        check=True, timeout=120,
    )  # fmt: skip
    return exe


def first_row(db: Path) -> bool:
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    except sqlite3.OperationalError:
        return False
    try:
        return bool(conn.execute("SELECT count(*) FROM host_intervals").fetchone()[0])
    except sqlite3.OperationalError:  # the writer has not made its tables yet
        return False
    finally:
        conn.close()


def one_start(workload: Path, tmp: Path, stacks: bool) -> tuple[float, float]:
    """(s to READY=1, s to the first host row) of one ``ingero trace --record``."""
    db, sock_path = tmp / "node.db", tmp / "notify.sock"
    for p in (db, sock_path, tmp / "node.db-wal", tmp / "node.db-shm"):
        p.unlink(missing_ok=True)
    job = subprocess.Popen([str(workload), "10", "0"], stdin=subprocess.PIPE,
                           stdout=subprocess.DEVNULL, text=True)  # fmt: skip
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(0.02)
    argv = [sys.executable, "-m", "ingero.cli.main", "trace", "--record", "--db", str(db),
            "--pid", str(job.pid), "--interval", "1"]  # fmt: skip
    if not stacks:
        argv.append("--no-stacks")
    env = dict(os.environ, NOTIFY_SOCKET=str(sock_path))
    t0 = time.monotonic()
    tracer = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)  # fmt: skip
    ready = row = 0.0
    try:
        while not row:
            if tracer.poll() is not None:
                raise RuntimeError(f"ingero trace exited {tracer.returncode}")
            if time.monotonic() - t0 > 300:
                raise RuntimeError("no host row in 300 s")
            try:
                if b"READY=1" in sock.recv(4096) and not ready:
                    ready = time.monotonic() - t0
            except TimeoutError:
                pass
            if ready and first_row(db):
                row = time.monotonic() - t0
        return ready, row
    finally:
        tracer.terminate()
        tracer.wait(timeout=120)
        job.kill()
        job.wait()
        sock.close()


def main() -> None:
    libs, repeat = setup(__doc__)
    print(
        "| stacks | compile s | compile CPU s | attach s | attach CPU s | ready s | first host row s |"
    )
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        workload = build_workload(tmp)
        for stacks in (True, False):
            loads = [one_load(libs, stacks) for _ in range(repeat)]
            starts = [one_start(workload, tmp, stacks) for _ in range(repeat)]
            cols = [statistics.median(x) for x in (*zip(*loads, strict=True),
                                                   *zip(*starts, strict=True))]  # fmt: skip
            print(f"| {'on' if stacks else 'off'} | " + " | ".join(f"{c:.2f}" for c in cols) + " |",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
