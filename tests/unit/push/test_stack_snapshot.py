"""The stack snapshot: py-spy's real JSON (recorded in tests/fixtures/pyspy from
loader.py there) into Stacks, then real py-spy runs against real processes, and what
goes wrong (exited process, not Python, no py-spy, huge or garbage output, a hang)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingero.nodedb.schema import connect
from ingero.otlp.limits import MAX_EVENT_BYTES
from ingero.otlp.logs import decode_events, encode_events
from ingero.push.stack_snapshot import (
    PERMISSION_DENIED,
    SnapshotPlan,
    Target,
    ThreadStack,
    dump,
    find_py_spy,
    fit,
    job_targets,
    parse_dump,
    snapshot,
)
from ingero.schema.events import Event
from ingero.schema.stacks import MAX_FRAMES, Frame, stack_from_json
from tests.pyspy_loader import LOADER, start_loader

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "pyspy"
T = Target(pid=4242, rank=5)


def fixture(name: str) -> str:
    return (FIXTURES / f"{name}.json").read_text()


def main_thread(threads: list[ThreadStack]) -> ThreadStack:
    return next(t for t in threads if t.thread == "MainThread")


# ---- the recorded dumps ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["running", "stopped"])
def test_nonblocking_dump_names_the_executing_line_and_its_callers(name: str) -> None:
    threads = parse_dump(fixture(name), T)
    assert {t.thread for t in threads} == {"MainThread", "prefetch"}
    main = main_thread(threads)
    assert (main.pid, main.rank) == (4242, 5)
    # innermost first: the line being executed (12, the sleep), not read_batch's def (10)
    assert [(f.function, f.line) for f in main.stack.frames] == [
        ("read_batch", 12),
        ("Loader.__next__", 18),
        ("<module>", 36),
    ]
    assert all(
        f.kind == "py" and f.file and f.file.endswith("loader.py") for f in main.stack.frames
    )
    assert main.stack.reason is None
    assert main.stack.summary() == (
        f"read_batch at {main.stack.frames[0].file}:12 ← Loader.__next__ at "
        f"{main.stack.frames[1].file}:18"
    )


def test_native_dump_interleaves_libraries_and_addresses() -> None:
    main = main_thread(parse_dump(fixture("native"), T))
    kinds = [f.kind for f in main.stack.frames]
    assert kinds[:2] == ["native", "native"] and "py" in kinds
    sleep = main.stack.frames[0]
    assert sleep.function == "clock_nanosleep" and sleep.lib and "libc" in sleep.lib
    assert sleep.line is None and sleep.file is None
    unnamed = [f for f in main.stack.frames if f.kind == "native" and f.function is None]
    assert unnamed and all(isinstance(f.addr, int) and f.addr > 0 for f in unnamed)
    # the Python frames keep their lines among the native ones
    assert [f.line for f in main.stack.python()] == [12, 18, 36]


def test_a_stack_deeper_than_the_cap_keeps_the_innermost_frames() -> None:
    deep = next(t for t in parse_dump(fixture("deep"), T) if t.thread == "deep")
    assert len(deep.stack.frames) == MAX_FRAMES
    assert deep.stack.frames[0] == Frame(
        "py", function="deep", file=deep.stack.frames[0].file, line=23
    )
    assert deep.stack.reason == f"truncated at {MAX_FRAMES} of 204 frames"
    small = next(t for t in parse_dump(fixture("deep"), T, max_frames=8) if t.thread == "deep")
    assert len(small.stack.frames) == 8 and small.stack.reason == "truncated at 8 of 204 frames"


def test_every_entry_round_trips_through_the_stack_codec() -> None:
    for name in ("running", "native", "deep"):
        for t in parse_dump(fixture(name), T):
            d = t.to_json()
            assert stack_from_json(d) == t.stack
            assert {"pid", "rank", "thread", "tid", "frames"} <= d.keys()


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        "{}",
        "[1]",
        '[{"frames": 3}]',
        '[{"frames": [{"name": 1, "filename": "x"}]}]',
        '[{"frames": [{"name": "f", "filename": "x", "module": null, "line": "7"}]}]',
        '[{"frames": [{"name": "f", "filename": "x", "module": 5, "line": 0}]}]',
        fixture("running")[: len(fixture("running")) // 2],
    ],
)
def test_garbage_is_a_reason_never_an_exception(text: str) -> None:
    [entry] = parse_dump(text, T)
    assert entry.stack.frames == ()
    assert entry.stack.reason and entry.stack.reason.startswith("py-spy output is not")


# ---- fitting into one event ------------------------------------------------------------


def test_fit_keeps_each_process_first_python_thread_within_the_budget() -> None:
    threads = [
        ThreadStack(pid, None, t.stack, t.thread, t.tid, t.active)
        for pid in (1, 2, 3)
        for t in parse_dump(fixture("deep"), T)
    ]
    kept, left_out = fit(threads, 12_000)
    assert left_out > 0 and len(kept) + left_out == len(threads)
    assert {t.pid for t in kept} == {1, 2, 3}  # round-robin: no process crowded out
    # the 204-frame stack keeps its innermost frames within a process's share
    deep = [t for t in kept if t.thread == "deep"]
    assert deep and all(t.stack.frames[0].function == "deep" for t in deep)
    assert all(t.stack.reason and t.stack.reason.startswith("truncated at ") for t in deep)
    assert len(json.dumps([t.to_json() for t in kept], separators=(",", ":"))) <= 12_000


def test_the_fitted_snapshot_travels_as_one_otlp_record() -> None:
    threads = [
        ThreadStack(pid, pid, t.stack, t.thread, t.tid, t.active)
        for pid in range(1, 9)
        for t in parse_dump(fixture("deep"), T)
    ]
    kept, _ = fit(threads, 10_000)
    event = Event(
        type="stack_snapshot",
        node_id="gpu07",
        cluster_id="c",
        timestamp=1.0,
        extra={"stacks": [t.to_json() for t in kept], "trigger": "collective_hang"},
    )
    decoded = decode_events(encode_events([event], {}))
    assert decoded.rejected == 0, decoded.error_message()
    [back] = decoded.events
    assert back.extra["stacks"] == event.extra["stacks"]
    assert MAX_EVENT_BYTES >= 16 * 1024


def test_a_dump_that_raises_is_an_entry_with_a_reason() -> None:
    def broken(target: Target) -> list[ThreadStack]:
        raise RuntimeError("boom")

    kept, left_out = snapshot([T], broken, 10_000)
    assert left_out == 0 and kept[0].stack.reason == "snapshot failed: RuntimeError"


# ---- one snapshot per episode ----------------------------------------------------------


def test_plan_takes_each_episode_once_and_spaces_them() -> None:
    plan = SnapshotPlan(min_gap_s=30.0, remember=2)
    assert not plan.due("", 0.0)
    assert plan.due("a", 0.0)
    plan.taken("a", 0.0)
    assert not plan.due("a", 100.0)  # once per episode
    assert not plan.due("b", 10.0)  # too soon after a: waits its turn
    assert plan.due("b", 30.0)
    plan.taken("b", 30.0)
    plan.taken("c", 60.0)
    assert plan.due("a", 200.0)  # forgotten beyond ``remember``: memory stays bounded


# ---- real py-spy, real processes -------------------------------------------------------


PY_SPY = find_py_spy()
needs_py_spy = pytest.mark.skipif(PY_SPY is None, reason="py-spy is not installed")


@pytest.fixture
def loader() -> Iterator[subprocess.Popen[str]]:
    proc = start_loader()
    yield proc
    proc.kill()
    proc.wait()


@needs_py_spy
@pytest.mark.parametrize("frozen", [False, True])
def test_real_dump_of_a_running_or_frozen_process(
    loader: subprocess.Popen[str], frozen: bool
) -> None:
    if frozen:
        os.kill(loader.pid, signal.SIGSTOP)
    try:
        threads = dump(Target(loader.pid, 3), py_spy=PY_SPY)
    finally:
        os.kill(loader.pid, signal.SIGCONT)
    main = main_thread(threads)
    assert main.stack.reason is None
    assert [(f.function, f.line) for f in main.stack.frames[:2]] == [
        ("read_batch", 12),
        ("Loader.__next__", 18),
    ]
    assert main.stack.frames[0].file == str(LOADER)
    assert main.rank == 3 and main.tid == loader.pid


@needs_py_spy
def test_real_exited_and_non_python_processes_give_reasons() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    [entry] = dump(Target(gone.pid), py_spy=PY_SPY)
    assert entry.stack.frames == () and entry.stack.reason
    assert entry.stack.reason.startswith("py-spy: ") and "\n" not in entry.stack.reason
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        [entry] = dump(Target(sleeper.pid), py_spy=PY_SPY)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert entry.stack.reason and "python" in entry.stack.reason.lower()


def test_permission_denied_says_what_is_missing(tmp_path: Path) -> None:
    """py-spy refusing another user's process (as under the shipped unit, without the
    stacks.conf drop-in) prints no ``Error:`` line; the reason still says why."""
    fake = tmp_path / "py-spy"
    fake.write_text(
        "#!/bin/sh\n"
        "echo 'Permission Denied: Try running again with elevated permissions' >&2\n"
        "exit 1\n"
    )
    fake.chmod(0o755)
    [entry] = dump(Target(os.getpid()), py_spy=str(fake))
    assert entry.stack.reason == PERMISSION_DENIED
    assert "CAP_SYS_PTRACE" in PERMISSION_DENIED


def test_missing_py_spy_is_a_reason(tmp_path: Path) -> None:
    assert find_py_spy(str(tmp_path / "py-spy")) is None
    assert find_py_spy("no-such-py-spy-here") is None
    [entry] = dump(T, py_spy=None)
    assert entry.stack.reason == "py-spy not found: no stack snapshot"
    [entry] = dump(T, py_spy=str(tmp_path / "py-spy"))  # vanished after it was found
    assert entry.stack.reason and entry.stack.reason.startswith("cannot run py-spy")


def _fake(tmp_path: Path, body: str) -> str:
    """An executable in py-spy's place: what a broken or hostile one would do."""
    path = tmp_path / "py-spy"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_huge_output_is_cut_and_the_dumper_killed(tmp_path: Path) -> None:
    fake = _fake(tmp_path, "exec yes '[[[[[[[[[[[[[[[['")
    [entry] = dump(T, py_spy=fake, max_output=100_000, timeout_s=30)
    assert entry.stack.reason == "py-spy wrote more than 100000 bytes"


def test_a_hanging_dumper_is_killed_at_the_timeout(tmp_path: Path) -> None:
    fake = _fake(tmp_path, "exec sleep 60")
    [entry] = dump(T, py_spy=fake, timeout_s=0.3)
    assert entry.stack.reason == "py-spy ran past 0.3 s"


def test_garbage_from_the_dumper_is_a_reason(tmp_path: Path) -> None:
    fake = _fake(tmp_path, "echo '<html>oops</html>'")
    [entry] = dump(T, py_spy=fake)
    assert entry.stack.reason and entry.stack.reason.startswith("py-spy output is not")


def test_job_targets_reads_the_live_processes_of_the_job(tmp_path: Path) -> None:
    db = tmp_path / "node.db"
    conn = connect(db).conn
    rows = [
        (101, "python", "/usr/bin/python3", "J1", 0, 1.0, 5.0),
        (102, "python", "/usr/bin/python3", "J1", 1, 1.0, 6.0),
        (103, "python", "/usr/bin/python3", "J2", 0, 1.0, 7.0),
        (104, "python", "/usr/bin/python3", "J1", 2, 1.0, 8.0),
    ]
    conn.executemany("INSERT INTO processes VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    conn.commit()
    conn.close()
    alive = {101, 102, 103}.__contains__
    assert job_targets(db, "J1", limit=8, pid_alive=alive) == [Target(102, 1), Target(101, 0)]
    assert job_targets(db, None, limit=2, pid_alive=alive) == [Target(103, 0), Target(102, 1)]
    assert job_targets(tmp_path / "missing.db", "J1", limit=8, pid_alive=alive) == []
