"""Sampled calls with call stacks, written into a node DB as ``ingero trace`` writes them.

``add_stacks`` adds raw events (each with its ``stack_key``) and the distinct stacks
through the tracer's own ``write_batch``, so explain, query, merge and export read what a
real tracer leaves behind (node DB v4).
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Sequence
from pathlib import Path

from ingero.nodedb.schema import connect
from ingero.nodedb.writer import Batch, write_batch
from ingero.schema.stacks import Frame, Stack


def py(function: str, file: str, line: int) -> Frame:
    return Frame("py", function=function, file=file, line=line)


def native(function: str, lib: str, addr: int = 0x7F00_0000_1000) -> Frame:
    return Frame("native", function=function, lib=lib, addr=addr, offset=0x10)


MODEL = "/work/job/model.py"
TORCH = "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py"
# cuMemAlloc from the line being executed in allocate_activations (its def is line 80),
# called from forward at line 141; native frames inner to the interpreter first.
ALLOC = Stack(
    (
        native("c10::cuda::CUDACachingAllocator::malloc", "/opt/libc10_cuda.so"),
        native("_PyEval_EvalFrameDefault", "/usr/lib/libpython3.11.so.1.0"),
        py("allocate_activations", MODEL, 88),
        py("forward", MODEL, 141),
        py("_call_impl", TORCH, 1527),
        py("train_step", "/work/job/train.py", 40),
    )
)
ALLOC_OTHER = Stack((py("init_buffers", MODEL, 30), py("main", "/work/job/train.py", 12)))
LAUNCH = Stack((py("forward", MODEL, 150), py("train_step", "/work/job/train.py", 41)))
NATIVE_ONLY = Stack(
    (native("ncclAllReduce", "/opt/libnccl.so.2"),),
    reason="python 3.9 not supported: native frames only",
)


def add_stacks(
    path: Path,
    start: float,
    end: float,
    calls: Sequence[tuple[str, str, Stack, int, int]],
    pid: int = 4242,
    job_id: str | None = "77",
    rank: int | None = 0,
) -> None:
    """``calls``: (source, op, stack, how many sampled calls, duration ns each), spread
    evenly over ``(start, end]``."""
    raw: list[dict[str, object]] = []
    stacks: dict[str, dict[str, object]] = {}
    for source, op, stack, n, dur in calls:
        key = stack.key()
        for i in range(n):
            ts = start + (end - start) * (i + 1) / (n + 1)
            raw.append(
                {"ts": ts, "pid": pid, "tid": pid, "job_id": job_id, "rank": rank,
                 "source": source, "op": op, "duration_ns": dur, "ret": 0, "bytes": 0,
                 "detail": None, "stack_key": key}
            )  # fmt: skip
        seen = stacks.setdefault(
            key, {"stack_key": key, "frames": stack.dumps(), "first_seen": end, "last_seen": start}
        )
        seen["first_seen"] = min(float(str(seen["first_seen"])), start)
        seen["last_seen"] = max(float(str(seen["last_seen"])), end)
    db = connect(path)
    try:
        write_batch(db, Batch(raw_events=raw, stacks=list(stacks.values())))
    finally:
        db.conn.close()


def downgrade_to_v3(src: Path, dst: Path) -> Path:
    """The same rows as a node DB of version 3 (no stacks): what an older tracer wrote."""
    shutil.copy(src, dst)
    with sqlite3.connect(dst) as conn:
        conn.execute("DROP TABLE stacks")
        conn.execute("ALTER TABLE raw_events DROP COLUMN stack_key")
        conn.execute("ALTER TABLE nccl_calls DROP COLUMN stack_key")
        conn.execute("PRAGMA user_version = 3")
    return dst
