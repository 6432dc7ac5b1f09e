"""The stack contract: a decoder returns all its encoder wrote, and refuses other shapes."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingero.schema.stacks import MAX_FRAMES, Frame, Stack, StackError, loads, stack_from_json

texts = st.one_of(st.none(), st.text(max_size=40))
ints = st.one_of(st.none(), st.integers(min_value=0, max_value=2**63 - 1))
frames = st.builds(Frame, kind=st.sampled_from(["py", "native"]), function=texts, file=texts,
                   line=ints, lib=texts, addr=ints, offset=ints)  # fmt: skip


@given(st.lists(frames, max_size=20), texts)
def test_round_trip(fs: list[Frame], reason: str | None) -> None:
    s = Stack(tuple(fs), reason or None)
    back = loads(s.dumps())
    assert back == s
    assert back.key() == s.key()


def test_key_ignores_addresses_but_not_lines() -> None:
    a = Stack((Frame("native", "f", lib="/l.so", addr=1), Frame("py", "g", "m.py", 3)))
    b = Stack((Frame("native", "f", lib="/l.so", addr=2), Frame("py", "g", "m.py", 3)))
    c = Stack((Frame("native", "f", lib="/l.so", addr=1), Frame("py", "g", "m.py", 4)))
    assert a.key() == b.key() != c.key()


def test_summary_prefers_python_frames() -> None:
    s = Stack((Frame("native", "cudaMalloc", lib="/x/libcudart.so.13"),
               Frame("py", "allocate", "model.py", 88), Frame("py", "forward", "model.py", 141)))  # fmt: skip
    assert s.summary() == "allocate at model.py:88 ← forward at model.py:141"
    assert Stack((), "gone").summary() == "gone"


def test_the_interpreters_entry_frames_never_name_a_stack() -> None:
    """As a real PyTorch 2.11 / CPython 3.12 stack read on an H200: a shim frame between each
    Python frame and after the outermost one."""
    shim = Frame("py", "<interpreter trampoline>", "<shim>")
    s = Stack((Frame("native", "cublasLtMatmul", lib="/x/libcublasLt.so.13"),
               Frame("py", "Linear.forward", "/v/site-packages/torch/nn/modules/linear.py", 134),
               shim, Frame("py", "step", "/job/train.py", 30), shim,
               Frame("py", "<module>", "/job/train.py", 42), shim))  # fmt: skip
    assert s.summary() == (
        "Linear.forward at /v/site-packages/torch/nn/modules/linear.py:134 ← step at /job/train.py:30"
    )
    assert all(f.file != "<shim>" for f in s.python())
    assert (
        s.key() != Stack(tuple(f for f in s.frames if f is not shim)).key()
    )  # kept, not hashed away


@pytest.mark.parametrize(
    "bad",
    [[], "x", {"frames": "x"}, {"frames": [{"kind": "java"}]}, {"frames": [1]},
     {"frames": [{"kind": "py", "line": "3"}]}, {"frames": [{"kind": "py", "line": True}]},
     {"frames": [{"kind": "py", "file": 3}]},
     {"frames": [{"kind": "py"}] * (MAX_FRAMES + 1)}],
)  # fmt: skip
def test_bad_shapes_are_one_clear_error(bad: object) -> None:
    with pytest.raises(StackError):
        stack_from_json(bad)


@given(st.text(max_size=200))
def test_fuzz_never_raises_anything_else(text: str) -> None:
    with contextlib.suppress(StackError):
        loads(text)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                    max_leaves=20))  # fmt: skip
def test_fuzz_json_values(value: object) -> None:
    with contextlib.suppress(StackError):
        stack_from_json({"frames": value} if isinstance(value, list) else value)
    json.dumps(value)
