"""Call sites in ``ingero explain``: estimates, the frames that name a stack, chains, CLI."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from ingero.cli.main import main
from ingero.explain.callsites import (
    OpTotal,
    SampledTotal,
    SiteData,
    SiteSample,
    call_sites,
    user_frames,
    where,
)
from ingero.schema.stacks import Frame, Stack
from tests.unit.chain_dbs import END, T0, real_db
from tests.unit.stack_dbs import (
    ALLOC,
    ALLOC_OTHER,
    LAUNCH,
    MODEL,
    NATIVE_ONLY,
    TORCH,
    add_stacks,
    downgrade_to_v3,
    native,
    py,
)

RECENT = T0 + 300.0  # chain_dbs: the recent 5-minute window is (RECENT, END]


def data(*samples: SiteSample, unstacked: int = 0, count: int = 1000) -> SiteData:
    ops: dict[tuple[str, str, int], list[int]] = {}
    for s in samples:
        t = ops.setdefault((s.source, s.op, s.pid), [0, 0])
        t[0] += s.samples
        t[1] += s.sampled_ns
    sampled = tuple(
        SampledTotal(src, op, pid, n + unstacked, ns + unstacked * 1000)
        for (src, op, pid), (n, ns) in ops.items()
    )
    totals = tuple(OpTotal(src, op, pid, count, count * 1000) for src, op, pid in ops)
    stacks = {ALLOC.key(): ALLOC, ALLOC_OTHER.key(): ALLOC_OTHER, LAUNCH.key(): LAUNCH}
    return SiteData(samples, sampled, totals, stacks, wall_ns=1e7)


def sample(stack: Stack, n: int, pid: int = 1, op: str = "cuMemAlloc") -> SiteSample:
    return SiteSample("cuda_driver", op, pid, stack.key(), n, n * 1000)


def test_a_stacks_share_of_its_ops_samples_scales_the_interval_totals() -> None:
    top, other = call_sites(data(sample(ALLOC, 9), sample(ALLOC_OTHER, 1)))
    assert (top.stack_key, top.calls, top.time_ns, top.samples) == (ALLOC.key(), 900, 900_000, 9)
    assert top.share == pytest.approx(0.9) and top.dominant
    assert top.wall_share == pytest.approx(0.09)
    assert (other.calls, other.dominant) == (100, False)


def test_samples_without_a_stack_still_count_in_their_op() -> None:
    (top,) = call_sites(data(sample(ALLOC, 5), unstacked=5))
    assert (top.calls, top.time_ns) == (500, 500_000)
    assert top.share == pytest.approx(0.5)


def test_sites_are_summed_over_processes_and_filtered_by_op_and_pid() -> None:
    d = data(sample(ALLOC, 4, pid=1), sample(ALLOC, 4, pid=2), sample(LAUNCH, 8, op="cuLaunch"))
    assert [s.op for s in call_sites(d)] == ["cuMemAlloc", "cuLaunch"]
    (alloc,) = call_sites(d, ops=[(None, "cuMemAlloc")])
    assert (alloc.calls, alloc.pids) == (2000, (1, 2))
    (one,) = call_sites(d, ops=[("cuda_driver", "cuMemAlloc")], pids={2})
    assert (one.calls, one.pids) == (1000, (2,))
    assert call_sites(d, ops=[("cuda_runtime", "cuMemAlloc")]) == []


def test_a_stack_is_named_by_the_jobs_own_lines_being_executed() -> None:
    # allocate_activations starts at line 80; the line being executed, 88, is the one shown.
    assert where(ALLOC) == (
        "in `allocate_activations` at `job/model.py:88` ← `forward` at `job/model.py:141`"
    )
    assert TORCH not in {f.file for f in user_frames(ALLOC)}
    library_only = Stack((py("_call_impl", TORCH, 1527), py("wrapper", TORCH, 20)))
    assert user_frames(library_only) == library_only.frames
    assert where(NATIVE_ONLY) == "in `ncclAllReduce` (libnccl.so.2)"
    assert where(Stack((), reason="process exited mid-walk")) == (
        "(no frames: process exited mid-walk)"
    )
    unknown = Stack((Frame("py", function="f", file="x.py"), native("??", "/lib/libc.so.6")))
    assert where(unknown) == "in `f` at `x.py`"


THIRD = Stack((py("resize", MODEL, 60), py("forward", MODEL, 143)))


def alloc_db(path: Path, split: tuple[Stack, ...] = (*[ALLOC] * 9, ALLOC_OTHER)) -> Path:
    """Allocator churn; each stack of ``split`` holds an even part of cuMemAlloc's samples."""
    real_db(path, "alloc")
    distinct = list({s.key(): s for s in split}.values())
    add_stacks(
        path,
        RECENT,
        END,
        [
            *[("cuda_driver", "cuMemAlloc", s, 10 * split.count(s), 150_000) for s in distinct],
            ("cuda_driver", "cuLaunchKernel", LAUNCH, 200, 6_500),
        ],
    )
    return path


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(["explain", "--until", str(END), *args])
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def test_the_chain_names_the_line_and_its_caller_and_the_fix_names_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = alloc_db(tmp_path / "node.db")
    code, out, err = run(capsys, "--db", str(db))
    assert (code, err) == (0, "")
    chain = next(line for line in out.splitlines() if line.startswith("1. allocator churn"))
    assert (
        "cuMemAlloc in `allocate_activations` at `job/model.py:88` ← `forward` at"
        " `job/model.py:141` ← allocator churn"
    ) in chain
    fix = next(line for line in out.splitlines() if line.startswith("   fix: Start at"))
    assert fix.startswith(
        "   fix: Start at `allocate_activations` at `job/model.py:88`: 90% of the cuMemAlloc"
    )
    assert "Top call sites, most CUDA time first:" in out
    assert "in `forward` at `job/model.py:150`" in out
    assert "(10% of cuMemAlloc, <1% of traced wall) in `init_buffers`" in out


def test_no_dominant_stack_no_line_in_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = alloc_db(tmp_path / "node.db", split=(ALLOC, ALLOC, ALLOC_OTHER, ALLOC_OTHER, THIRD))
    _, out, _ = run(capsys, "--db", str(db))
    assert "fix: Start at" not in out
    assert "alloc_churn from: " in out and "`init_buffers` at `job/model.py:30`" in out


def test_json_keeps_frames_as_structure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = alloc_db(tmp_path / "node.db")
    _, out, _ = run(capsys, "--db", str(db), "--json")
    report = json.loads(out)
    (cause,) = report["chains"][0]["causes"]
    site = cause["call_sites"][0]
    assert site["stack"] == ALLOC.to_json()
    assert site["stack"]["frames"][2] == {
        "kind": "py",
        "function": "allocate_activations",
        "file": MODEL,
        "line": 88,
    }
    assert (site["op"], site["stack_key"], site["samples"]) == ("cuMemAlloc", ALLOC.key(), 90)
    assert report["chains"][0]["fix"].startswith("Start at `allocate_activations`")
    top = report["call_sites"]
    assert [s["op"] for s in top] == ["cuLaunchKernel", "cuMemAlloc", "cuMemAlloc"]
    assert (
        top[0]["where"] == "in `forward` at `job/model.py:150` ← `train_step` at `job/train.py:41`"
    )


def test_with_no_chain_the_top_call_sites_are_still_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "steady.db"
    real_db(db)
    add_stacks(db, RECENT, END, [("cuda_driver", "cuMemAlloc", ALLOC, 10, 150_000)])
    _, out, _ = run(capsys, "--db", str(db))
    assert "Causal chains" not in out
    assert "1. cuMemAlloc: " in out and "`allocate_activations` at `job/model.py:88`" in out


def test_a_damaged_stack_row_is_left_out_not_fatal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = alloc_db(tmp_path / "node.db")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE stacks SET frames = '{\"frames\": 3}' WHERE stack_key = ?",
                     (ALLOC.key(),))  # fmt: skip
    code, out, err = run(capsys, "--db", str(db))
    assert (code, err) == (0, "")
    assert "job/model.py:88" not in out and "`init_buffers` at `job/model.py:30`" in out


def test_an_older_node_db_explains_exactly_as_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    v4 = real_db(tmp_path / "v4.db", "alloc")
    v3 = downgrade_to_v3(v4, tmp_path / "v3.db")
    outs: list[Any] = []
    for db in (v4, v3):
        _, text, _ = run(capsys, "--db", str(db))
        _, js, _ = run(capsys, "--db", str(db), "--json")
        report = json.loads(js)
        report.pop("db")
        outs.append((text.replace(str(db), "DB"), report))
    assert outs[0] == outs[1]
    text, report = outs[1]
    assert "call site" not in text.lower() and "Start at" not in text
    assert report["call_sites"] == [] and report["chains"][0]["causes"][0]["call_sites"] == []


def test_peer_lag_names_the_late_ranks_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.unit.chain_dbs import Proc

    late = Stack((py("__next__", "/work/job/data/loader.py", 212), py("train", MODEL, 40)))
    waits = Stack((py("all_reduce_grads", MODEL, 170), py("train", MODEL, 44)))
    db = real_db(tmp_path / "n.db", "peer", procs=(Proc(), Proc(pid=4343, rank=1)))
    with sqlite3.connect(db) as conn:
        for pid, stack in ((4343, late), (4242, waits)):
            conn.execute("UPDATE raw_events SET stack_key = ? WHERE pid = ?", (stack.key(), pid))
            conn.execute("INSERT INTO stacks VALUES (?, ?, ?, ?)",
                         (stack.key(), stack.dumps(), T0, END))  # fmt: skip
    _, out, _ = run(capsys, "--db", str(db), "--json")
    chain = json.loads(out)["chains"][0]
    (cause,) = [c for c in chain["causes"] if c["signal"] == "peer_lag"]
    assert [s["stack_key"] for s in cause["call_sites"]] == [late.key()]
    assert "← `train` at `job/model.py:40`" in chain["headline"]
    assert cause["call_sites"][0]["pids"] == [4343]


def test_call_sites_are_read_from_the_windows_newest_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ingero.explain import reader
    from ingero.nodedb import stacks
    from ingero.nodedb.schema import open_node_db

    db = real_db(tmp_path / "n.db")
    add_stacks(db, RECENT, RECENT + 100, [("cuda_driver", "cuMemAlloc", ALLOC, 20, 1000)])
    add_stacks(db, END - 50, END, [("cuda_driver", "cuMemAlloc", LAUNCH, 5, 1000)])
    monkeypatch.setattr(stacks, "SITE_ROWS", 5)
    conn = open_node_db(db)
    try:
        data = reader.read_call_sites(conn, END, 300.0, None)
    finally:
        conn.conn.close()
    assert {s.stack_key for s in data.samples} == {LAUNCH.key()}
    assert [(t.samples, t.op) for t in data.sampled] == [(5, "cuMemAlloc")]


def test_across_nodes_the_top_line_carries_the_call_site(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # explain --nodes prints each node's top line from the JSON its ingero answered
    from ingero.fanout.across import top_line

    _, out, _ = run(capsys, "--db", str(alloc_db(tmp_path / "node.db")), "--json")
    line = top_line("gpu03", json.loads(out))
    assert line.startswith("gpu03: allocator churn (high, ")
    assert "in `allocate_activations` at `job/model.py:88` ← `forward`" in line


def test_an_nccl_op_without_stacked_raw_events_takes_its_sites_from_nccl_calls(
    tmp_path: Path,
) -> None:
    from ingero.explain import reader
    from ingero.nodedb.schema import connect, open_node_db
    from ingero.nodedb.writer import Batch, write_batch

    hung = Stack((py("step", MODEL, 200),))
    db = real_db(tmp_path / "n.db")
    calls = [{"ts_enter": END - 10 + i, "ts_return": END - 9.5 + i, "pid": 4242, "op": "ncclAllReduce",
              "comm_hash": "c0ffee", "seq": i + 1, "stack_key": hung.key()} for i in range(4)]  # fmt: skip
    conn = connect(db)
    stack_row = {"stack_key": hung.key(), "frames": hung.dumps(), "first_seen": END - 10,
                 "last_seen": END}  # fmt: skip
    write_batch(conn, Batch(nccl_calls=calls, stacks=[stack_row]))
    conn.conn.close()
    ro = open_node_db(db)
    try:
        data = reader.read_call_sites(ro, END, 300.0, None)
    finally:
        ro.conn.close()
    (site,) = call_sites(data, ops=[("nccl", "ncclAllReduce")])
    assert (site.stack_key, site.samples) == (hung.key(), 4)
    assert site.calls > 4  # scaled by what intervals counted for ncclAllReduce
