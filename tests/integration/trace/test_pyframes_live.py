"""Reading live CPython processes' frames from outside (no BPF): every interpreter here."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingero.trace.pyframes.reader import PyProcess, open_or_reason
from tests.integration.trace.conftest import interpreters

pytestmark = pytest.mark.integration

HERE = Path(__file__).parent
SCRIPT = HERE / "py_stacks.py"


def _start(python: str, *args: str) -> tuple[subprocess.Popen[str], dict[str, int]]:
    proc = subprocess.Popen([python, str(SCRIPT), *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None
    marks = dict(kv.split("=") for kv in proc.stdout.readline().split())
    return proc, {k: int(v) for k, v in marks.items()}


@pytest.fixture
def workloads() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.parametrize("python", interpreters())
def test_every_thread_names_its_executing_lines(
    python: str, workloads: list[subprocess.Popen[str]]
) -> None:
    proc, marks = _start(python, "wait")
    workloads.append(proc)
    reader = PyProcess.open(proc.pid)
    stacks = reader.stacks()
    assert proc.pid in stacks and len(stacks) == 4  # main + 3 threads, from the interpreter's list
    script = str(SCRIPT)
    main = stacks.pop(proc.pid)
    assert [(f.function, f.file, f.line) for f in main.frames] == [
        ("<module>", script, marks["module"])
    ]
    for stack in stacks.values():
        ours = [(f.function, f.line) for f in stack.frames if f.file == script]
        # 3.10 has no co_qualname: the method is named without its class there.
        method = "Model.forward" if reader.layout.version >= (3, 11) else "forward"
        assert ours == [
            ("leaf", marks["leaf"]),
            (method, marks["forward"]),
            ("outer", marks["outer"]),
        ]
        assert stack.reason is None
        # The executing line, never the def line.
        assert marks["leaf"] != leaf_def_line()
    proc.communicate("go\n", timeout=30)


def leaf_def_line() -> int:
    for i, line in enumerate(SCRIPT.read_text().splitlines(), 1):
        if line.startswith("def leaf("):
            return i
    raise AssertionError("no leaf in the script")


def test_a_stack_deeper_than_the_cap_is_truncated_with_a_reason(
    workloads: list[subprocess.Popen[str]],
) -> None:
    proc, marks = _start(sys.executable, "recurse", "300")
    workloads.append(proc)
    reader = PyProcess.open(proc.pid)
    deep = [s for tid, s in reader.stacks().items() if tid != proc.pid]
    assert len(deep) == 1
    stack = deep[0]
    assert stack.reason == "truncated at 128 frames"
    assert len(stack.frames) == 128
    names = [f.function for f in stack.frames if f.file == str(SCRIPT)]
    assert names[:3] == ["leaf", "Model.forward", "outer"] and set(names[3:]) == {"recurse"}
    lines = [f.line for f in stack.frames if f.function == "recurse"]
    assert lines[0] == marks["bottom"] and set(lines[1:]) == {marks["recurse"]}
    proc.communicate("go\n", timeout=30)


def test_an_exited_process_gives_a_reason_not_frames(
    workloads: list[subprocess.Popen[str]],
) -> None:
    proc, _ = _start(sys.executable, "wait")
    workloads.append(proc)
    reader = PyProcess.open(proc.pid)
    threads = reader.threads()
    proc.kill()
    proc.wait()
    for tstate in threads.values():
        walk = reader.walk(tstate)
        assert walk.frames == () and walk.reason == "process exited mid-walk"
    assert open_or_reason(proc.pid) == "process exited"


def test_other_processes_get_a_reason(workloads: list[subprocess.Popen[str]]) -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        assert open_or_reason(sleeper.pid) == "not a CPython process"
    finally:
        sleeper.kill()
        sleeper.wait()
    old = sorted(Path.home().glob(".pyenv/versions/3.9.*/bin/python3.9"))
    if not old:
        pytest.skip("no python3.9 here for the unknown-version case")
    proc = subprocess.Popen([str(old[0]), "-c", "import sys; print(1, flush=True); sys.stdin.readline()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    workloads.append(proc)
    assert proc.stdout is not None and proc.stdout.readline()
    assert open_or_reason(proc.pid) == "python 3.9 not supported"
