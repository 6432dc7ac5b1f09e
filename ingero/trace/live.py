"""The live terminal view: per-op table of the last interval, the top call site of each op
(where the interval's sampled calls carry stacks) and a host context line."""

from __future__ import annotations

from collections import defaultdict

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ingero.explain.callsites import where
from ingero.trace.tracer import TickResult

_SHORT = {"cuda_runtime": "rt", "cuda_driver": "drv"}
# Call-site lines under the table: the ops with the most time first, one line each, so the
# view keeps its height whatever the number of ops.
MAX_SITES = 6


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
    order = [k for k, _ in sorted(merged.items(), key=lambda kv: -kv[1]["total_ns"])]
    sites = _sites(result, order)
    h = result.host
    line = Text(
        f"host: off-CPU {_ms(h.get('offcpu_ns'))} ms · pages {h.get('page_allocs', 0)} · "
        f"block I/O {h.get('block_io_count', 0)} (p99 {_us(h.get('block_io_p99_ns'))} µs) · "
        f"TCP retrans {h.get('tcp_retransmits', 0)} · samples {result.samples} · "
        f"dropped {h.get('dropped_events', 0)} · probes {result.probes} · "
        f"processes {result.processes}"
    )
    return Group(table, *sites, line)


def _sites(result: TickResult, order: list[tuple[str, str]]) -> list[Text]:
    """Per op (in the table's order), the stack most of its sampled time came from."""
    time: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    sampled: dict[tuple[str, str], int] = defaultdict(int)
    for r in result.raw_events:
        op = (str(r.get("source")), str(r.get("op")))
        dur = r.get("duration_ns")
        ns = dur if isinstance(dur, int) and dur > 0 else 1
        sampled[op] += ns
        key = r.get("stack_key")
        if isinstance(key, str) and key in result.stacks:
            time[op][key] += ns
    ranked = order + sorted(set(time) - set(order))
    lines: list[Text] = []
    for op in ranked:
        if op not in time or len(lines) == MAX_SITES:
            continue
        key, ns = max(time[op].items(), key=lambda kv: (kv[1], kv[0]))
        share = ns / sampled[op]
        lines.append(
            Text(f"  {op[1]} {100 * share:.0f}% {where(result.stacks[key])}", no_wrap=True)
        )
    if lines:
        lines.insert(0, Text("top call site per op (share of its sampled time):"))
    return lines


def _ms(ns: object) -> str:
    return f"{int(ns) / 1e6:.1f}" if isinstance(ns, int) else "-"
