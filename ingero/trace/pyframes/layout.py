"""Where CPython keeps what a stack walk reads, per version (x86-64, default GIL build).

3.10-3.12 have no runtime description of their own layout: the tables below are
``offsetof`` of CPython's own structs, compiled against each version's installed headers
(tests/unit/trace/test_pyframes_layout.py recompiles them when the headers are present and
compares). 3.13 and 3.14 describe themselves: ``_PyRuntime`` starts with
``_Py_DebugOffsets`` (cookie ``xdebugpy``, then the version), read out of the process by
``from_debug_offsets``. The struct itself changes between versions (3.14 added fields inside
its groups and new groups), so each version's field order is listed here; a version
without a list (3.15+) gets native frames and a reason.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace


class UnsupportedPython(Exception):
    """The process runs a CPython whose frames this reader cannot walk (the message says why)."""


PY_WIN = 128  # bytes of a frame the BPF program reads at once (PY_WIN in bpf/ingero.bpf.c)


@dataclass(frozen=True)
class FrameWindow:
    start: int
    length: int


@dataclass(frozen=True)
class Layout:
    version: tuple[int, int]
    runtime_interpreters_head: int
    interp_threads_head: int
    tstate_next: int
    tstate_thread_id: int  # pthread_t
    tstate_native_thread_id: int | None  # the kernel tid (3.11+)
    tstate_frame: int  # the frame pointer, or (with cframe_current_frame) the _PyCFrame*
    cframe_current_frame: int | None  # 3.11/3.12: tstate->cframe->current_frame
    frame_previous: int
    frame_code: int
    frame_instr: int  # 3.10: int f_lasti (code units); 3.11+: _Py_CODEUNIT* pointer
    frame_owner: int | None  # char owner (3.11+)
    shim_owner: int | None  # frames with this owner are C-stack shims (3.12+), skipped
    code_filename: int
    code_name: int  # co_qualname where the version has it, else co_name
    code_firstlineno: int
    code_linetable: int
    code_adaptive: int | None  # bytecode start inside the code object (3.11+)
    # Low bits of the frame's code pointer that are a tag, not address: 3.14's
    # f_executable is a _PyStackRef (Py_TAG_BITS in pycore_stackref.h), cleared before use.
    code_tag_bits: int = 0
    bytes_size: int = 16
    bytes_sval: int = 32
    unicode_state: int = 32
    unicode_length: int = 16
    ascii_size: int = 48
    compact_size: int = 72

    def window(self) -> FrameWindow:
        """The bytes of a frame that hold what a walk reads (the BPF program reads them in
        one go per frame): from the first field to the last one's end, the three 8-byte
        fields at 8-byte steps from the start. Raises UnsupportedPython when they do not
        fit PY_WIN bytes that way (a layout no version has had)."""
        fields = [self.frame_previous, self.frame_code, self.frame_instr]
        start = min(fields) & ~7
        end = max(f + 8 for f in fields)
        if self.frame_owner is not None:
            start = min(start, self.frame_owner & ~7)
            end = max(end, self.frame_owner + 1)
        length = (end - start + 7) & ~7
        if any((f - start) % 8 for f in fields) or length > PY_WIN:
            raise UnsupportedPython(f"python {self.version}: frame fields do not fit one read")
        return FrameWindow(start, length)

    @property
    def linetable(self) -> str:
        return "310" if self.version < (3, 11) else "311"

    @property
    def lasti_index(self) -> bool:
        """3.10 frames hold an instruction index, later ones a pointer into the bytecode."""
        return self.version < (3, 11)


PY310 = Layout(
    version=(3, 10), runtime_interpreters_head=32, interp_threads_head=8, tstate_next=8,
    tstate_thread_id=176, tstate_native_thread_id=None, tstate_frame=24,
    cframe_current_frame=None, frame_previous=24, frame_code=32, frame_instr=96,
    frame_owner=None, shim_owner=None, code_filename=104, code_name=112,
    code_firstlineno=40, code_linetable=120, code_adaptive=None,
)  # fmt: skip
PY311 = Layout(
    version=(3, 11), runtime_interpreters_head=40, interp_threads_head=16, tstate_next=8,
    tstate_thread_id=152, tstate_native_thread_id=160, tstate_frame=56,
    cframe_current_frame=8, frame_previous=48, frame_code=32, frame_instr=56,
    frame_owner=69, shim_owner=None, code_filename=112, code_name=128,
    code_firstlineno=72, code_linetable=136, code_adaptive=184,
)  # fmt: skip
PY312 = Layout(
    version=(3, 12), runtime_interpreters_head=40, interp_threads_head=72, tstate_next=8,
    tstate_thread_id=136, tstate_native_thread_id=144, tstate_frame=56,
    cframe_current_frame=0, frame_previous=8, frame_code=0, frame_instr=56,
    frame_owner=70, shim_owner=3, code_filename=112, code_name=128,
    code_firstlineno=68, code_linetable=136, code_adaptive=192,
    ascii_size=40, compact_size=56,
)  # fmt: skip
TABLES = {(3, 10): PY310, (3, 11): PY311, (3, 12): PY312}

DEBUG_COOKIE = b"xdebugpy"
# _Py_DebugOffsets (Include/internal/pycore_debug_offsets.h): the cookie, then u64 fields in
# groups (most start with the size of the struct they describe). 3.13's groups are listed
# up to unicode_object (the last one read); 3.14's all, in the order of 3.14's header, which
# the live 3.14 tests check against the interpreter's own sizes.
_DEBUG_313 = (
    ("head", ("version", "free_threaded")),
    ("runtime", ("size", "finalizing", "interpreters_head")),
    ("interp", ("size", "id", "next", "threads_head", "gc", "imports_modules", "sysdict",
                "builtins", "ceval_gil", "gil_runtime_state", "gil_enabled", "gil_locked",
                "gil_holder")),
    ("tstate", ("size", "prev", "next", "interp", "current_frame", "thread_id",
                "native_thread_id", "datastack_chunk", "status")),
    ("frame", ("size", "previous", "executable", "instr_ptr", "localsplus", "owner")),
    ("code", ("size", "filename", "name", "qualname", "linetable", "firstlineno",
              "argcount", "localsplusnames", "localspluskinds", "co_code_adaptive")),
    ("pyobject", ("size", "ob_type")),
    ("type", ("size", "tp_name", "tp_repr", "tp_flags")),
    ("tuple", ("size", "ob_item", "ob_size")),
    ("list", ("size", "ob_item", "ob_size")),
    ("dict", ("size", "ma_keys", "ma_values")),
    ("float", ("size", "ob_fval")),
    ("long", ("size", "lv_tag", "ob_digit")),
    ("bytes", ("size", "ob_size", "ob_sval")),
    ("unicode", ("size", "state", "length", "asciiobject_size")),
)  # fmt: skip
# 3.14: threads_main, code_object_generation and tlbc_generation in the interpreter,
# stackpointer and tlbc_index in the frame, co_tlbc in the code object, and the set,
# generator, llist_node and debugger_support groups.
_DEBUG_314 = (
    ("head", ("version", "free_threaded")),
    ("runtime", ("size", "finalizing", "interpreters_head")),
    ("interp", ("size", "id", "next", "threads_head", "threads_main", "gc",
                "imports_modules", "sysdict", "builtins", "ceval_gil", "gil_runtime_state",
                "gil_enabled", "gil_locked", "gil_holder", "code_object_generation",
                "tlbc_generation")),
    ("tstate", ("size", "prev", "next", "interp", "current_frame", "thread_id",
                "native_thread_id", "datastack_chunk", "status")),
    ("frame", ("size", "previous", "executable", "instr_ptr", "localsplus", "owner",
               "stackpointer", "tlbc_index")),
    ("code", ("size", "filename", "name", "qualname", "linetable", "firstlineno",
              "argcount", "localsplusnames", "localspluskinds", "co_code_adaptive",
              "co_tlbc")),
    ("pyobject", ("size", "ob_type")),
    ("type", ("size", "tp_name", "tp_repr", "tp_flags")),
    ("tuple", ("size", "ob_item", "ob_size")),
    ("list", ("size", "ob_item", "ob_size")),
    ("set", ("size", "used", "table", "mask")),
    ("dict", ("size", "ma_keys", "ma_values")),
    ("float", ("size", "ob_fval")),
    ("long", ("size", "lv_tag", "ob_digit")),
    ("bytes", ("size", "ob_size", "ob_sval")),
    ("unicode", ("size", "state", "length", "asciiobject_size")),
    ("gc", ("size", "collecting")),
    ("gen", ("size", "gi_name", "gi_iframe", "gi_frame_state")),
    ("llist_node", ("next", "prev")),
    ("debugger_support", ("eval_breaker", "remote_debugger_support",
                          "remote_debugging_enabled", "debugger_pending_call",
                          "debugger_script_path", "debugger_script_path_size")),
)  # fmt: skip
DEBUG_GROUPS = {(3, 13): _DEBUG_313, (3, 14): _DEBUG_314}


def _debug_size(groups: tuple[tuple[str, tuple[str, ...]], ...]) -> int:
    return 8 + 8 * sum(len(fields) for _, fields in groups)


# Bytes read from the start of _PyRuntime: enough for every version listed.
DEBUG_OFFSETS_SIZE = max(_debug_size(g) for g in DEBUG_GROUPS.values())
PY_TAG_BITS_314 = 3  # pycore_stackref.h: Py_TAG_REFCNT 1, Py_INT_TAG 3


def version_of_hex(hexversion: int) -> tuple[int, int]:
    return (hexversion >> 24) & 0xFF, (hexversion >> 16) & 0xFF


def parse_debug_offsets(data: bytes) -> dict[str, int]:
    """``group.field`` → value from the start of ``_PyRuntime``, in the struct of the
    version the struct itself names."""
    if len(data) < 16:
        raise UnsupportedPython(f"_Py_DebugOffsets: {len(data)} bytes, need 16")
    if data[:8] != DEBUG_COOKIE:
        raise UnsupportedPython("_PyRuntime does not start with the _Py_DebugOffsets cookie")
    version = version_of_hex(struct.unpack_from("<Q", data, 8)[0])
    groups = DEBUG_GROUPS.get(version)
    if groups is None:
        raise UnsupportedPython(f"python {version[0]}.{version[1]} not supported")
    size = _debug_size(groups)
    if len(data) < size:
        raise UnsupportedPython(f"_Py_DebugOffsets: {len(data)} bytes, need {size}")
    values = iter(struct.unpack_from(f"<{(size - 8) // 8}Q", data, 8))
    return {f"{group}.{name}": next(values) for group, fields in groups for name in fields}


def from_debug_offsets(data: bytes) -> Layout:
    """The layout a 3.13 or 3.14 process describes in its ``_Py_DebugOffsets``."""
    d = parse_debug_offsets(data)
    version = version_of_hex(d["head.version"])
    if d["head.free_threaded"]:
        raise UnsupportedPython("free-threaded CPython build (Py_GIL_DISABLED) not supported")
    return Layout(
        version=version,
        runtime_interpreters_head=d["runtime.interpreters_head"],
        interp_threads_head=d["interp.threads_head"],
        tstate_next=d["tstate.next"],
        tstate_thread_id=d["tstate.thread_id"],
        tstate_native_thread_id=d["tstate.native_thread_id"],
        tstate_frame=d["tstate.current_frame"],
        cframe_current_frame=None,
        frame_previous=d["frame.previous"],
        frame_code=d["frame.executable"],
        frame_instr=d["frame.instr_ptr"],
        frame_owner=d["frame.owner"],
        # The entry frame the interpreter pushes per call from C: FRAME_OWNED_BY_CSTACK in
        # 3.13, the same value renamed FRAME_OWNED_BY_INTERPRETER in 3.14.
        shim_owner=3,
        code_filename=d["code.filename"],
        code_name=d["code.qualname"],
        code_firstlineno=d["code.firstlineno"],
        code_linetable=d["code.linetable"],
        code_adaptive=d["code.co_code_adaptive"],
        code_tag_bits=PY_TAG_BITS_314 if version >= (3, 14) else 0,
        bytes_size=d["bytes.ob_size"],
        bytes_sval=d["bytes.ob_sval"],
        unicode_state=d["unicode.state"],
        unicode_length=d["unicode.length"],
        ascii_size=d["unicode.asciiobject_size"],
        compact_size=d["unicode.asciiobject_size"] + 16,  # + utf8_length, utf8
    )


def table_for(version: tuple[int, int]) -> Layout:
    """The compiled-in layout of a version without ``_Py_DebugOffsets``."""
    layout = TABLES.get(version)
    if layout is None:
        raise UnsupportedPython(f"python {version[0]}.{version[1]} not supported")
    return replace(layout)
