"""The live terminal view: per-op table of the last interval and a host context line."""

from __future__ import annotations

from collections import defaultdict

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ingero.trace.tracer import TickResult

_SHORT = {"cuda_runtime": "rt", "cuda_driver": "drv"}


def _us(ns: object) -> str:
    return f"{int(ns) / 1000:.1f}" if isinstance(ns, int) else "-"


def render(result: TickResult) -> Group:
    """One frame: ops summed over processes (percentiles: the worst process), host line."""
    seconds = max(result.ts_end - result.ts_start, 1e-9)
    merged: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for row in result.intervals:
        m = merged[(str(row["source"]), str(row["op"]))]
        for key in ("count", "total_ns", "errors", "bytes"):
            value = row[key]
            m[key] += value if isinstance(value, int) else 0
        for key in ("p50_ns", "p95_ns", "p99_ns"):
            value = row[key]
            m[key] = max(m[key], value if isinstance(value, int) else 0)
        m["pids"] += 1
    table = Table(title=f"ingero trace — last {seconds:.1f}s", box=box.SIMPLE_HEAD, show_edge=False)
    table.add_column("src", no_wrap=True, min_width=4)
    table.add_column("op", no_wrap=True, min_width=21)
    for name in ("calls/s", "p50µs", "p95µs", "p99µs", "err/s", "MB/s", "pids"):
        table.add_column(name, justify="right", no_wrap=True, min_width=len(name))
    for (source, op), m in sorted(merged.items(), key=lambda kv: -kv[1]["total_ns"]):
        table.add_row(
            _SHORT.get(source, source), op, f"{m['count'] / seconds:.0f}", _us(m["p50_ns"]),
            _us(m["p95_ns"]), _us(m["p99_ns"]), f"{m['errors'] / seconds:.0f}",
            f"{m['bytes'] / seconds / 1e6:.1f}", str(m["pids"]),
        )  # fmt: skip
    h = result.host
    line = Text(
        f"host: off-CPU {_ms(h.get('offcpu_ns'))} ms · pages {h.get('page_allocs', 0)} · "
        f"block I/O {h.get('block_io_count', 0)} (p99 {_us(h.get('block_io_p99_ns'))} µs) · "
        f"TCP retrans {h.get('tcp_retransmits', 0)} · samples {result.samples} · "
        f"dropped {h.get('dropped_events', 0)} · probes {result.probes} · "
        f"processes {result.processes}"
    )
    return Group(table, line)


def _ms(ns: object) -> str:
    return f"{int(ns) / 1e6:.1f}" if isinstance(ns, int) else "-"
