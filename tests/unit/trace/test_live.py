"""live: the per-op table and host line rendered from one interval."""

from __future__ import annotations

from rich.console import Console

from ingero.schema.stacks import Frame, Stack
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


def _raw(op: str, stack: Stack | None, dur: int) -> dict[str, object]:
    return {"source": "cuda_runtime", "op": op, "pid": 1, "duration_ns": dur,
            "stack_key": None if stack is None else stack.key()}  # fmt: skip


def test_render_names_the_top_call_site_of_each_op() -> None:
    hot = Stack(
        (Frame("py", "allocate", "/job/model.py", 88), Frame("py", "forward", "/job/model.py", 141))
    )
    cold = Stack((Frame("py", "warmup", "/job/model.py", 20),))
    free = Stack((Frame("native", "free_all", lib="/opt/libjob.so"),), reason="not python")
    result = TickResult(
        ts_start=0.0, ts_end=1.0,
        intervals=[_row(1, "cudaMalloc", 100, 2000), _row(1, "cudaFree", 10, 500),
                   _row(1, "cudaMemcpy", 5, 500)],
        host={}, samples=9, bad_samples=0, probes=18, processes=1,
        raw_events=[_raw("cudaMalloc", hot, 3000), _raw("cudaMalloc", hot, 3000),
                    _raw("cudaMalloc", cold, 1000), _raw("cudaMalloc", None, 3000),
                    _raw("cudaFree", free, 10), _raw("cudaMemcpy", None, 10)],
        stacks={s.key(): s for s in (hot, cold, free)},
    )  # fmt: skip
    console = Console(width=200, record=True)
    console.print(render(result))
    lines = console.export_text().splitlines()
    sites = lines[lines.index("top call site per op (share of its sampled time):") + 1 :]
    assert sites[0].split() == ["cudaMalloc", "60%", "in", "`allocate`", "at", "`job/model.py:88`",
                                "←", "`forward`", "at", "`job/model.py:141`"]  # fmt: skip
    assert sites[1].strip() == "cudaFree 100% in `free_all` (libjob.so)"
    assert "cudaMemcpy" not in sites[2]  # no stack sampled: no line
    assert sites[2].startswith("host:")


def test_render_without_stacks_has_no_call_site_lines() -> None:
    result = TickResult(0.0, 1.0, [_row(1, "cudaMalloc", 1, 1)], {}, 1, 0, 1, 1,
                        raw_events=[_raw("cudaMalloc", None, 5)])  # fmt: skip
    console = Console(width=160, record=True)
    console.print(render(result))
    assert "call site" not in console.export_text()
