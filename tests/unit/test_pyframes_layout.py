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


def test_debug_offsets_give_a_313_layout_and_refuse_others() -> None:
    layout = from_debug_offsets(_debug_offsets(0x030D00F0))
    assert layout.version == (3, 13) and layout.cframe_current_frame is None
    with pytest.raises(UnsupportedPython, match="free-threaded"):
        from_debug_offsets(_debug_offsets(0x030D00F0, free_threaded=1))
    with pytest.raises(UnsupportedPython, match=r"python 3\.14 not supported"):
        from_debug_offsets(_debug_offsets(0x030E00F0))
    with pytest.raises(UnsupportedPython, match="cookie"):
        from_debug_offsets(b"x" * DEBUG_OFFSETS_SIZE)
    with pytest.raises(UnsupportedPython, match="need"):
        from_debug_offsets(DEBUG_COOKIE)
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
