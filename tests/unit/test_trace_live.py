"""live: the per-op table and host line rendered from one interval."""

from __future__ import annotations

from rich.console import Console

from ingero.trace.live import render
from ingero.trace.tracer import TickResult


def _row(pid: int, op: str, count: int, p99: int) -> dict[str, object]:
    return {"pid": pid, "source": "cuda_runtime", "op": op, "count": count,
            "total_ns": count * 1000, "p50_ns": 900, "p95_ns": 1500, "p99_ns": p99,
            "errors": count, "bytes": count * 4096}  # fmt: skip


def test_render_merges_processes_and_shows_host_context() -> None:
    result = TickResult(
        ts_start=0.0, ts_end=2.0,
        intervals=[_row(1, "cudaMalloc", 100, 2000), _row(2, "cudaMalloc", 300, 8000),
                   _row(1, "cudaFree", 10, 500)],
        host={"offcpu_ns": 5_000_000, "page_allocs": 12, "block_io_count": 3,
              "block_io_p99_ns": 250_000, "tcp_retransmits": 1, "dropped_events": 4},
        samples=7, bad_samples=0, probes=18, processes=2,
    )  # fmt: skip
    console = Console(width=160, record=True)
    console.print(render(result))
    text = console.export_text()
    malloc = next(line for line in text.splitlines() if "cudaMalloc" in line)
    assert "200" in malloc  # (100 + 300) calls over 2 s
    assert "8.0" in malloc  # worst process's p99, in µs
    assert "0.8" in malloc  # 400 calls of 4096 bytes in 2 s, in MB/s
    assert text.index("cudaMalloc") < text.index("cudaFree")  # busiest first
    assert "off-CPU 5.0 ms" in text and "dropped 4" in text and "TCP retrans 1" in text
