"""procmaps: finding CUDA/NCCL libraries in /proc/PID/maps (fixture proc trees)."""

from __future__ import annotations

from pathlib import Path

from ingero.trace.procmaps import lib_kind, parse_maps, scan, unique_libraries

MAPS = """\
55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 1234 /usr/bin/python3.11
7f1000000000-7f1000020000 r--p 00000000 fd:01 5555 /opt/conda/lib/libcudart.so.12.4.127
7f1000020000-7f1000090000 r-xp 00020000 fd:01 5555 /opt/conda/lib/libcudart.so.12.4.127
7f2000000000-7f2000100000 r-xp 00000000 fd:01 7777 /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
7f3000000000-7f3000100000 r-xp 00000000 fd:01 8888 /site-packages/nvidia/nccl/lib/libnccl.so.2
7f4000000000-7f4000001000 rw-p 00000000 00:00 0
7f5000000000-7f5000001000 r-xp 00000000 fd:01 9999 /usr/lib/libcudnn.so.9
7f6000000000-7f6000001000 r-xp 00000000 fd:01 4444 /tmp/my libcudart.so (deleted)
"""


def test_lib_kind() -> None:
    assert lib_kind("/a/libcudart.so.12") == "cudart"
    assert lib_kind("/a/libcudart.so") == "cudart"
    assert lib_kind("/a/libcuda.so.1") == "cuda"
    assert lib_kind("/a/libnccl.so.2") == "nccl"
    assert lib_kind("/a/libcudnn.so.9") is None
    assert lib_kind("/a/libcudart_static.a") is None
    assert lib_kind("/a/libcuda.so.1 (deleted)") == "cuda"


def test_parse_maps_first_path_per_kind() -> None:
    found = parse_maps(MAPS)
    assert found == {
        "cudart": "/opt/conda/lib/libcudart.so.12.4.127",
        "cuda": "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
        "nccl": "/site-packages/nvidia/nccl/lib/libnccl.so.2",
    }


def test_parse_maps_garbage_is_ignored() -> None:
    assert parse_maps("not a maps line\n\n7f-7f r-xp 0 fd:01\n") == {}


def _proc(tmp: Path, pid: int, maps: str, files: list[str]) -> None:
    d = tmp / str(pid)
    (d / "root").mkdir(parents=True)
    (d / "maps").write_text(maps)
    for f in files:
        p = d / "root" / f.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"\x7fELF")


def test_scan_resolves_paths_through_the_process_root(tmp_path: Path) -> None:
    # A "container": its maps name /usr/lib/libcudart.so.12, found under /proc/PID/root.
    lib = "/usr/lib/libcudart.so.12"
    _proc(tmp_path, 10, f"7f-80 r-xp 0 fd:01 42 {lib}\n", [lib])
    _proc(tmp_path, 11, "7f-80 r-xp 0 fd:01 43 /usr/lib/libc.so.6\n", [])
    (tmp_path / "self").mkdir()
    procs = scan(proc=tmp_path)
    assert [p.pid for p in procs] == [10]
    found = procs[0].libs["cudart"]
    assert found.path == str(tmp_path / "10/root/usr/lib/libcudart.so.12")
    assert found.inode == (tmp_path / "10/root/usr/lib/libcudart.so.12").stat().st_ino


def test_scan_skips_vanished_processes_and_missing_files(tmp_path: Path) -> None:
    _proc(tmp_path, 20, "7f-80 r-xp 0 fd:01 42 /gone/libcudart.so.12\n", [])
    assert scan([20, 21], proc=tmp_path) == []


def test_unique_libraries_by_inode(tmp_path: Path) -> None:
    lib = "/usr/lib/libnccl.so.2"
    _proc(tmp_path, 30, f"7f-80 r-xp 0 fd:01 42 {lib}\n", [lib])
    (tmp_path / "31").mkdir()
    (tmp_path / "31/maps").write_text(f"7f-80 r-xp 0 fd:01 42 {lib}\n")
    # pid 31 shares pid 30's root (same file, same inode)
    (tmp_path / "31/root").symlink_to(tmp_path / "30/root")
    libs = unique_libraries(scan(proc=tmp_path))
    assert len(libs) == 1 and libs[0].kind == "nccl"
