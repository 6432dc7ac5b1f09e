"""Call stacks: one shape for every layer (tracer, node DB, explain, export, events, Echo).

A stack is a tuple of frames, innermost first (the frame that made the call comes first).
Two kinds of frame:

- ``py``: a CPython frame. ``file``, ``line`` and ``function`` (the code object's qualified
  name). ``line`` is the line being executed in that frame (from the frame's instruction
  offset and the code object's line table), never the function's ``def`` line; ``None``
  when the line table does not map the offset.
- ``native``: a machine frame. ``function`` (symbol, or ``None`` when unknown), ``lib``
  (the mapped file's path), ``addr`` (the absolute instruction address, for re-symbolising)
  and ``offset`` (from the function's start where known).

A stack that could only be partly read says why in ``reason`` (e.g. "python 3.9 not
supported: native frames only", "process exited mid-walk", "truncated at 64 frames"); it is
still a valid stack. The store keeps one row per distinct stack, keyed by ``stack_key``: a
hash over the frames only (addresses left out, so the same code path in two processes with
different ASLR bases shares a key), so events refer to a stack by its key.

This module is the contract; field names are public (node DB ``stacks.frames``, the
``stack`` event's ``extra.stacks``, Echo's answers): add, never rename.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

FrameKind = Literal["py", "native"]

# Bounds every producer applies and every decoder enforces, so a stack never grows without
# limit whatever a process or a peer sends.
MAX_FRAMES = 128
MAX_TEXT = 512  # characters of a file path, function name, library path or reason


# The file CPython 3.12+ gives the entry frame it pushes each time C code calls into Python
# (code object "<interpreter trampoline>"): a frame of no line of the job, seen interleaved
# in every real PyTorch stack. Readers skip it when they name a stack.
SHIM_FILES: frozenset[str | None] = frozenset({"<shim>"})


class StackError(ValueError):
    """A stack's JSON does not have the shape this module writes."""


@dataclass(frozen=True)
class Frame:
    kind: FrameKind
    function: str | None = None
    file: str | None = None  # py frames
    line: int | None = None  # py frames: the line being executed
    lib: str | None = None  # native frames: the mapped file
    addr: int | None = None  # native frames: absolute instruction address
    offset: int | None = None  # native frames: from the symbol's start

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind}
        for name in ("function", "file", "line", "lib", "addr", "offset"):
            v = getattr(self, name)
            if v is not None:
                d[name] = v
        return d

    def label(self) -> str:
        """One human line: ``forward at model.py:141`` or ``cudaMalloc (libcudart.so.13)``."""
        fn = self.function or "??"
        if self.kind == "py":
            where = self.file or "?"
            return f"{fn} at {where}:{self.line}" if self.line is not None else f"{fn} at {where}"
        lib = self.lib.rsplit("/", 1)[-1] if self.lib else "?"
        return f"{short_function(fn)} ({lib})"


ANON = "(anonymous namespace)"


def short_function(name: str) -> str:
    """A C++ function's qualified name without its template arguments, return type and
    parameters (``c10d::ProcessGroupNCCL::collective<…>`` for a 700-character instance);
    ``(anonymous namespace)`` is kept. Other names are returned as they are."""
    if "(" not in name and "<" not in name:
        return name
    out = ""
    angle = brace = 0
    i = 0
    while i < len(name):
        c = name[i]
        if not angle and not brace and out.endswith("operator"):
            # operator(), operator<<, operator new: the operator's own text up to "(".
            j = i + 2 if name.startswith("()", i) else name.find("(", i)
            j = len(name) if j == -1 else j
            out += name[i:j]
            i = j
            continue
        if c == "<":
            if angle == 0 and brace == 0:
                out += "<…>"
            angle += 1
        elif c == ">" and angle:
            angle -= 1
        elif angle or brace:
            brace += (c == "{") - (c == "}")
        elif c == "{":
            brace = 1
            out += "{…}"
        elif c == "(":
            if name.startswith(ANON, i):
                out += ANON
                i += len(ANON)
                continue
            break  # the parameter list: what follows is qualifiers and clone notes
        elif c == " ":
            out = ""  # a return type came first: keep what follows it
        else:
            out += c
        i += 1
    return out or name


@dataclass(frozen=True)
class Stack:
    frames: tuple[Frame, ...]
    reason: str | None = None  # why the stack is partial, or None
    extra: Mapping[str, Any] = field(default_factory=dict)  # producer's notes, not hashed

    def key(self) -> str:
        return stack_key(self.frames)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"frames": [f.to_json() for f in self.frames]}
        if self.reason:
            d["reason"] = self.reason
        return d

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    def python(self) -> tuple[Frame, ...]:
        """The Python frames of the job, without the interpreter's own entry frames."""
        return tuple(f for f in self.frames if f.kind == "py" and f.file not in SHIM_FILES)

    def summary(self, depth: int = 2) -> str:
        """``allocate at model.py:88 ← forward at model.py:141``: the innermost Python frames
        (native ones when the stack has none)."""
        chosen = self.python() or self.frames
        text = " ← ".join(f.label() for f in chosen[:depth])
        return text or (self.reason or "no frames")


def stack_key(frames: Iterable[Frame]) -> str:
    """16 hex digits over what identifies a code path: kind, function, file, line, lib."""
    h = hashlib.blake2b(digest_size=8)
    for f in frames:
        h.update(f"{f.kind}\x1f{f.function}\x1f{f.file}\x1f{f.line}\x1f{f.lib}\x1e".encode())
    return h.hexdigest()


def _text(v: object, what: str) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str):
        raise StackError(f"{what} is not a string")
    return v[:MAX_TEXT]


def _int(v: object, what: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise StackError(f"{what} is not an integer")
    return v


def frame_from_json(d: object) -> Frame:
    if not isinstance(d, Mapping):
        raise StackError("a frame is not an object")
    kind = d.get("kind")
    if kind not in ("py", "native"):
        raise StackError(f"unknown frame kind {str(kind)[:40]!r}")
    return Frame(
        kind=kind,
        function=_text(d.get("function"), "frame function"),
        file=_text(d.get("file"), "frame file"),
        line=_int(d.get("line"), "frame line"),
        lib=_text(d.get("lib"), "frame lib"),
        addr=_int(d.get("addr"), "frame addr"),
        offset=_int(d.get("offset"), "frame offset"),
    )


def stack_from_json(d: object) -> Stack:
    """The inverse of ``Stack.to_json``; raises StackError on any other shape."""
    if not isinstance(d, Mapping):
        raise StackError("a stack is not an object")
    frames = d.get("frames")
    if not isinstance(frames, Sequence) or isinstance(frames, (str, bytes)):
        raise StackError("stack frames are not a list")
    if len(frames) > MAX_FRAMES:
        raise StackError(f"stack of {len(frames)} frames, at most {MAX_FRAMES}")
    return Stack(
        frames=tuple(frame_from_json(f) for f in frames),
        reason=_text(d.get("reason"), "stack reason"),
    )


def loads(text: str) -> Stack:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise StackError(f"stack is not JSON: {exc}") from None
    return stack_from_json(data)
