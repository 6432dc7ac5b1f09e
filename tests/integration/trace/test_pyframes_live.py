"""Reading live CPython processes' frames from outside (no BPF): every interpreter here."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingero.trace.pyframes.layout import DEBUG_OFFSETS_SIZE, parse_debug_offsets
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
    if reader.layout.code_tag_bits:
        # 3.14's f_executable may carry a reference tag in its low bits: the same frame.
        code, instr = reader.walk(reader.threads()[proc.pid]).frames[0]
        assert reader.frame(code | 1, instr) == reader.frame(code, instr) == main.frames[0]
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


# What an interpreter says of its own structs, for _Py_DebugOffsets' fields (3.13+): a
# field list out of order or missing a field shifts every later group off these.
SELF_SIZES = """
import json, sys, types
sizes = {
    "head.version": sys.hexversion,
    "pyobject.size": object.__basicsize__,
    "code.co_code_adaptive": types.CodeType.__basicsize__,
    "tuple.ob_item": tuple.__basicsize__,
    "list.size": list.__basicsize__,
    "dict.size": dict.__basicsize__,
    "float.size": float.__basicsize__,
    "long.ob_digit": int.__basicsize__,
    "bytes.ob_sval": bytes.__basicsize__ - 1,
    "unicode.size": str.__basicsize__,
}
if sys.version_info >= (3, 14):
    sizes["set.size"] = set.__basicsize__
    sizes["gen.basicsize"] = types.GeneratorType.__basicsize__
print(json.dumps(sizes), flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("python", interpreters(minor_from=13))
def test_debug_offsets_agree_with_the_interpreters_own_sizes(
    python: str, workloads: list[subprocess.Popen[str]]
) -> None:
    proc = subprocess.Popen([python, "-c", SELF_SIZES], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    workloads.append(proc)
    assert proc.stdout is not None
    sizes = json.loads(proc.stdout.readline())
    if sizes["head.version"] < 0x030D0000:
        pytest.skip("no _Py_DebugOffsets before 3.13")
    reader = PyProcess.open(proc.pid)
    d = parse_debug_offsets(reader.mem.read(reader.runtime, DEBUG_OFFSETS_SIZE))
    # A generator's basic size ends where its frame's locals start.
    d["gen.basicsize"] = d.get("gen.gi_iframe", 0) + d["frame.localsplus"]
    got = {name: d[name] for name in sizes}
    assert got == sizes
    assert d["pyobject.ob_type"] == 8 and d["head.free_threaded"] == 0
    proc.communicate("go\n", timeout=30)
