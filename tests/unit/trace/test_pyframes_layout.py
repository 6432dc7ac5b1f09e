"""The per-version layout tables are CPython's own offsetof(), where the headers are here."""

from __future__ import annotations

import dataclasses
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from ingero.trace.pyframes.layout import (
    DEBUG_COOKIE,
    DEBUG_OFFSETS_SIZE,
    PY310,
    PY311,
    PY312,
    PY_WIN,
    Layout,
    UnsupportedPython,
    from_debug_offsets,
    parse_debug_offsets,
    table_for,
)

SOURCE = Path(__file__).parent / "data" / "py_offsets.c"
# offsetof name in py_offsets.c → Layout field
FIELDS = {
    "runtime_interpreters_head": "runtime_interpreters_head",
    "interp_threads_head": "interp_threads_head",
    "tstate_next": "tstate_next",
    "tstate_thread_id": "tstate_thread_id",
    "tstate_native_thread_id": "tstate_native_thread_id",
    "tstate_frame": "tstate_frame",
    "tstate_cframe": "tstate_frame",
    "cframe_current_frame": "cframe_current_frame",
    "frame_back": "frame_previous",
    "frame_previous": "frame_previous",
    "frame_code": "frame_code",
    "frame_lasti": "frame_instr",
    "frame_instr": "frame_instr",
    "frame_owner": "frame_owner",
    "code_qualname": "code_name",
    "code_adaptive": "code_adaptive",
    "code_filename": "code_filename",
    "code_firstlineno": "code_firstlineno",
    "code_linetable": "code_linetable",
    "bytes_size": "bytes_size",
    "bytes_sval": "bytes_sval",
    "unicode_state": "unicode_state",
    "unicode_length": "unicode_length",
    "ascii_size": "ascii_size",
    "compact_size": "compact_size",
}


def _include(minor: int) -> Path | None:
    for prefix in sorted(Path.home().glob(f".pyenv/versions/3.{minor}.*")):
        inc = prefix / "include" / f"python3.{minor}"
        if (inc / "internal" / "pycore_runtime.h").exists():
            return inc
    return None


@pytest.mark.parametrize("minor, layout", [(10, PY310), (11, PY311), (12, PY312)])
def test_table_is_cpythons_offsetof(minor: int, layout: object, tmp_path: Path) -> None:
    inc = _include(minor)
    if inc is None or shutil.which("gcc") is None:
        pytest.skip(f"no CPython 3.{minor} internal headers (or gcc) here")
    exe = tmp_path / "offsets"
    subprocess.run(["gcc", "-w", f"-I{inc}", f"-I{inc}/internal", str(SOURCE), "-o", str(exe)],
                   check=True, timeout=120)  # fmt: skip
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    got = dict(line.split("=") for line in out.split())
    table = dataclasses.asdict(layout)  # type: ignore[call-overload]
    compared = 0
    for name, value in got.items():
        if name == "code_name" and "code_qualname" in got:
            continue  # 3.11+ names frames by co_qualname
        assert table[FIELDS.get(name, name)] == int(value), name
        compared += 1
    assert compared >= 18


def _debug_offsets(version: int, free_threaded: int = 0) -> bytes:
    n = (DEBUG_OFFSETS_SIZE - 8) // 8
    values = [version, free_threaded, *range(100, 100 + n - 2)]
    return DEBUG_COOKIE + struct.pack(f"<{n}Q", *values)


# The u64 index (after the cookie) of fields a walk reads, in each version's header
# (Include/internal/pycore_debug_offsets.h): 3.14 added threads_main inside the interpreter
# group, stackpointer and tlbc_index in the frame's, co_tlbc in the code object's, and the
# set group before dict, so its later fields all moved.
HEADER_INDEX = {
    (3, 13): {"tstate.current_frame": 22, "frame.executable": 29, "frame.owner": 32,
              "code.qualname": 36, "code.co_code_adaptive": 42, "bytes.ob_sval": 65,
              "unicode.asciiobject_size": 69},
    (3, 14): {"tstate.current_frame": 25, "frame.executable": 32, "frame.owner": 35,
              "code.qualname": 41, "code.co_code_adaptive": 47, "bytes.ob_sval": 75,
              "unicode.asciiobject_size": 79},
}  # fmt: skip


@pytest.mark.parametrize("minor", [13, 14])
def test_debug_offsets_are_read_in_their_versions_struct(minor: int) -> None:
    data = _debug_offsets(0x030000F0 | minor << 16)
    d = parse_debug_offsets(data)
    for name, index in HEADER_INDEX[(3, minor)].items():
        assert d[name] == 100 + index - 2, name
    layout = from_debug_offsets(data)
    assert layout.version == (3, minor) and layout.cframe_current_frame is None
    assert layout.frame_code == 100 + HEADER_INDEX[(3, minor)]["frame.executable"] - 2
    # 3.14's f_executable is a tagged _PyStackRef.
    assert layout.code_tag_bits == (3 if minor == 14 else 0)


def test_debug_offsets_refuse_other_versions_and_bad_bytes() -> None:
    with pytest.raises(UnsupportedPython, match="free-threaded"):
        from_debug_offsets(_debug_offsets(0x030D00F0, free_threaded=1))
    with pytest.raises(UnsupportedPython, match="free-threaded"):
        from_debug_offsets(_debug_offsets(0x030E00F0, free_threaded=1))
    with pytest.raises(UnsupportedPython, match=r"python 3\.15 not supported"):
        from_debug_offsets(_debug_offsets(0x030F00A1))
    with pytest.raises(UnsupportedPython, match="cookie"):
        from_debug_offsets(b"x" * DEBUG_OFFSETS_SIZE)
    with pytest.raises(UnsupportedPython, match="need 16"):
        from_debug_offsets(DEBUG_COOKIE)
    with pytest.raises(UnsupportedPython, match="need"):
        from_debug_offsets(_debug_offsets(0x030E00F0)[:200])
    with pytest.raises(UnsupportedPython, match=r"python 3\.9 not supported"):
        table_for((3, 9))
    with pytest.raises(UnsupportedPython, match=r"python 3\.9 not supported"):
        table_for((3, 9))


@pytest.mark.parametrize("layout", [PY310, PY311, PY312], ids=["3.10", "3.11", "3.12"])
def test_a_frames_fields_fit_one_read(layout: Layout) -> None:
    """The BPF walk reads each frame's window in one go: every field inside it, the three
    pointers 8-byte aligned in it (the program masks their offsets that way)."""
    w = layout.window()
    assert 0 < w.length <= PY_WIN and w.length % 8 == 0
    for field in (layout.frame_previous, layout.frame_code, layout.frame_instr):
        assert (field - w.start) % 8 == 0 and field + 8 <= w.start + w.length
    if layout.frame_owner is not None:
        assert w.start <= layout.frame_owner < w.start + w.length


def test_a_layout_whose_frame_does_not_fit_one_read_is_refused() -> None:
    wide = dataclasses.replace(PY312, frame_instr=PY_WIN + 64)
    with pytest.raises(UnsupportedPython, match="do not fit one read"):
        wide.window()
