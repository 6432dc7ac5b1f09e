"""What the annotate server's core holds at its bounds: ``max_writers`` pids, each with its
rate bucket and ``max_open_phases`` open phases of names as long as a line allows (the
worst a writer can leave behind), plus their uids' buckets. Prints the bytes Python
allocated for them (tracemalloc), and that the count stayed at the bound when twice as many
writers came by.

    .venv/bin/python -m bench.annotate_memory
"""

from __future__ import annotations

import json
import tracemalloc

from ingero.annotate.codec import DEFAULT_LIMITS
from ingero.annotate.server import Annotations, ServerLimits, Writer
from ingero.runtime.clock import ManualClock


def main() -> None:
    limits = ServerLimits(lines_per_s=1e9, burst=10**9, uid_lines_per_s=1e9, uid_burst=10**9)
    name_len = DEFAULT_LIMITS.max_name_bytes
    tracemalloc.start()
    core = Annotations(ManualClock(), limits)
    before = tracemalloc.get_traced_memory()[0]
    for pid in range(1, 2 * limits.max_writers + 1):
        core.open(pid, Writer(pid, pid))
        lines = b"".join(
            json.dumps({"kind": "phase", "name": f"{pid:08d}{i:08d}".ljust(name_len, "p"),
                        "state": "begin"}).encode() + b"\n"
            for i in range(limits.max_open_phases)
        )  # fmt: skip
        core.feed(pid, lines)
        core.take()
        core.close(pid)
    held = tracemalloc.get_traced_memory()[0] - before
    print(
        f"writers remembered: {core.writers} of {2 * limits.max_writers} seen"
        f" (max_writers {limits.max_writers}), {limits.max_open_phases} open phases each"
    )
    print(f"held: {held / 2**20:.1f} MiB")  # fmt: skip


if __name__ == "__main__":
    main()
