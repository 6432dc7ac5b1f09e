"""How long the tracer takes to attach its probes and to take them off again at stop.

Run as root: ``.venv/bin/python -m bench.trace_stop`` (``--lib cudart:PATH --lib
nccl:PATH ...``; by default the libcudart BCC finds, and the real libnccl the tests cache
in ``~/.cache/ingero-tests/nccl``). Loads the program once per mode, attaches every op of
each library and closes it again: through uprobe_multi links (the default where the
kernel has them) and through BCC's perf-event uprobes (``load(uprobe_multi=False)``).
Prints the probes attached, the attach time and the close time of each mode (wall time,
median of ``--repeat``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from ingero.trace.ops import CUDA, CUDART, NCCL
from ingero.trace.probes import load
from ingero.trace.procmaps import LibraryFile

KINDS = {"cudart": CUDART, "cuda": CUDA, "nccl": NCCL}
CACHED_NCCL = Path.home() / ".cache" / "ingero-tests" / "nccl" / "lib" / "libnccl.so.2"


def libraries(specs: list[str]) -> list[LibraryFile]:
    if not specs:
        from ingero.trace.bccload import load_bcc

        found = load_bcc().BPF.find_library(b"cudart")
        specs = [f"cudart:{found.decode()}"] if found else []
        if CACHED_NCCL.exists():
            specs.append(f"nccl:{CACHED_NCCL}")
    out = []
    for spec in specs:
        kind, _, path = spec.partition(":")
        real = os.path.realpath(path)
        st = os.stat(real)
        out.append(LibraryFile(KINDS[kind], real, st.st_dev, st.st_ino))
    return out


def one(libs: list[LibraryFile], multi: bool) -> tuple[int, int, float, float]:
    """(probes attached, links made, attach s, close s) of one load."""
    probes = load(sample_every=64, uprobe_multi=multi)
    t0 = time.monotonic()
    attached = sum(len(probes.attach_library(lib)) for lib in libs)
    t1 = time.monotonic()
    links = len(probes.links)
    probes.close()
    return attached, links, t1 - t0, time.monotonic() - t1


def setup(doc: str) -> tuple[list[LibraryFile], int]:
    """``--lib`` and ``--repeat`` of a tracer bench: (the libraries, the repeat), printed."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--lib", action="append", default=[], metavar="KIND:PATH")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    libs = libraries(args.lib)
    print("libraries:", ", ".join(f"{lib.kind}:{lib.path}" for lib in libs))
    print(f"load average {os.getloadavg()[0]:.1f}; median of {args.repeat}")
    return libs, int(args.repeat)


def main() -> None:
    libs, repeat = setup(__doc__)
    print("| attach | ops attached | links | attach s | stop s |")
    print("|---|---|---|---|---|")
    for multi in (True, False):
        runs = [one(libs, multi) for _ in range(repeat)]
        attached, links = runs[0][0], runs[0][1]
        attach = statistics.median(r[2] for r in runs)
        close = statistics.median(r[3] for r in runs)
        mode = "uprobe_multi links" if multi else "perf-event uprobes"
        print(f"| {mode} | {attached} | {links} | {attach:.2f} | {close:.2f} |")


if __name__ == "__main__":
    main()
