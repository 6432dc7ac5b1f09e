"""probes.program_text and the BPF source: generated from the op table, consistent with it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ingero.trace.aggregate import HOST_COUNTERS, NSLOTS
from ingero.trace.ops import (
    LAUNCH_CONFIG_STREAM_OFFSET,
    OP_COMM_INIT,
    OP_OFFCPU,
    OPS,
    STREAM_KINDS,
)
from ingero.trace.probes import bpf_source_path, probe_names, program_text
from ingero.trace.symbols import Attachment


def test_one_entry_probe_per_generic_op() -> None:
    text = program_text(bpf_source_path().read_text(), sample_every=16)
    assert "#define SAMPLE_EVERY 16" in text
    assert f"#define OP_OFFCPU {OP_OFFCPU}" in text
    entries = re.findall(
        r"^PROBE_ENTRY\((\d+), (\d), (\d), (\d), (\d), ([01]), (\d), (\d), (-1|\d+), (\d)\)$",
        text, re.M,
    )  # fmt: skip
    generic = [i for i, op in enumerate(OPS) if op.symbols and not op.special]
    assert [int(p[0]) for p in entries] == generic
    for p in entries:
        op = OPS[int(p[0])]
        assert tuple(int(x) for x in p[1:5]) == (op.bytes_arg, op.count_arg, op.dtype_arg,
                                                 op.comm_arg)  # fmt: skip
        assert int(p[5]) == int(op.numbered)
        assert (int(p[6]), int(p[7])) == (op.stream_arg, STREAM_KINDS[op.stream_kind])
        assert (int(p[8]), int(p[9])) == (op.stream_offset, op.event_arg)


def test_generic_ops_return_through_one_of_two_shared_programs() -> None:
    """The return program says whether every call is sampled; the op itself comes from the
    call's entry. Each name is a program of the source."""
    source = bpf_source_path().read_text()
    for i, op in enumerate(OPS):
        if not op.symbols or op.special:
            continue
        enter, leave = probe_names(Attachment(i, op, op.symbols[0], 0x10))
        assert enter == f"enter_{i}"
        assert leave == ("leave_always" if op.always_sample else "leave_sampled")
        assert (
            f"int {leave}(struct pt_regs *ctx) {{ return call_leave(ctx, {int(op.always_sample)}); }}"
            in source
        )


def test_stream_kinds_match_the_c_source() -> None:
    source = bpf_source_path().read_text()
    found = {k.lower(): int(v) for k, v in re.findall(r"#define STREAM_(\w+) (\d+)", source)}
    assert found == {"none": 0, **{k: v for k, v in STREAM_KINDS.items() if k}}


def test_the_stream_argument_of_each_stream_op() -> None:
    """x86-64 slots: a dim3 by value takes two, so cudaLaunchKernel's stream is slot 8;
    cuLaunchKernel's is its 9th parameter, the third on the stack. The Ex launches pass a
    config pointer (the stream at an offset in it); event records pass (event, stream) and
    event synchronizes the event alone."""
    streams = {
        op.name: (op.stream_arg, op.stream_kind, op.stream_offset, op.event_arg)
        for op in OPS
        if op.stream_kind
    }
    assert streams == {
        "cudaLaunchKernel": (8, "launch", -1, 0),
        "cudaLaunchKernelExC": (1, "launch", 32, 0),  # config->stream
        "cudaStreamSynchronize": (1, "sync", -1, 0),
        "cudaEventRecord": (2, "record", -1, 1),  # (event, stream[, flags])
        "cudaEventSynchronize": (0, "event_sync", -1, 1),  # (event)
        "cuLaunchKernel": (9, "launch", -1, 0),
        "cuLaunchKernelEx": (1, "launch", 32, 0),  # config->hStream
        "cuLaunchCooperativeKernel": (9, "launch", -1, 0),
        "cuStreamSynchronize": (1, "sync", -1, 0),
        "cuEventRecord": (2, "record", -1, 1),
        "cuEventSynchronize": (0, "event_sync", -1, 1),
    }


def test_special_ops_use_hand_written_probes() -> None:
    att = Attachment(OP_COMM_INIT, OPS[OP_COMM_INIT], "ncclCommInitRank", 0x10)
    assert probe_names(att) == ("enter_comm_init", "leave_comm_init")
    source = bpf_source_path().read_text()
    assert "int enter_comm_init(" in source and "int leave_comm_destroy(" in source


def test_host_counter_slots_match_the_c_source() -> None:
    source = bpf_source_path().read_text()
    slots = dict(re.findall(r"#define HOST_(\w+) (\d+)", source))
    names = {"PAGE_ALLOCS": "page_allocs", "BLOCK_IO": "block_io_count",
             "BLOCK_IO_NS": "block_io_ns", "TCP_RETRANS": "tcp_retransmits",
             "DROPS": "dropped_events", "OFFCPU_NS": "offcpu_ns", "SAMPLES": "samples"}  # fmt: skip
    for c_name, py_name in names.items():
        assert HOST_COUNTERS.index(py_name) == int(slots[c_name])


def test_slot_count_matches_the_c_source() -> None:
    source = bpf_source_path().read_text()
    assert re.search(rf"#define NSLOTS {NSLOTS}\b", source)


def test_no_kernel_struct_reads() -> None:
    # Headers may not match the running kernel: only tracepoint args and uprobe registers,
    # and kernel fields at the offsets the kernel's own BTF gives (sessions.TRAMPOLINE).
    source = bpf_source_path().read_text()
    reads = re.findall(r"bpf_probe_read_kernel\(([^()]*(?:\([^()]*\)[^()]*)*)\)", source)
    assert len(reads) == source.count("bpf_probe_read_kernel") == 3
    assert all(re.search(r"\(void \*\)\(\w+ \+ TRAMPOLINE_\d\)$", r) for r in reads), reads
    assert "bpf_core_read" not in source.lower()
    # The task pointer is only a key for task-local storage, never dereferenced.
    for line in source.splitlines():
        if "task_struct" in line:
            assert "bpf_get_current_task_btf()" in line, line
    assert not re.search(r"\bt->", source)


def test_sample_every_must_be_positive() -> None:
    with pytest.raises(ValueError):
        program_text("", 0)


def _cuda_include() -> Path | None:
    """The CUDA toolkit's include directory ($CUDA_HOME, else /usr/local/cuda*), or None."""
    homes = [Path(os.environ["CUDA_HOME"])] if os.environ.get("CUDA_HOME") else []
    homes += sorted(Path("/usr/local").glob("cuda*"))
    for home in homes:
        if (home / "include/cuda.h").is_file() and (home / "include/driver_types.h").is_file():
            return home / "include"
    return None


def test_launch_config_stream_offset_matches_the_cuda_headers(tmp_path: Path) -> None:
    """The stream's offset in CUlaunchConfig and cudaLaunchConfig_t, as the installed
    toolkit's headers lay them out, is the one the program reads at."""
    include = _cuda_include()
    if include is None:
        pytest.skip("no CUDA toolkit headers (cuda.h) under $CUDA_HOME or /usr/local/cuda*")
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed (tests/apt-packages.txt lists it)")
    src = tmp_path / "offsets.c"
    src.write_text(
        "#include <stddef.h>\n#include <stdio.h>\n#include <cuda.h>\n#include <driver_types.h>\n"
        "int main(void) {\n"
        '    printf("%zu %zu\\n", offsetof(CUlaunchConfig, hStream),\n'
        "           offsetof(cudaLaunchConfig_t, stream));\n"
        "    return 0;\n}\n"
    )
    exe = tmp_path / "offsets"
    subprocess.run(["gcc", f"-I{include}", "-o", str(exe), str(src)], check=True, timeout=60)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True, timeout=10)
    driver, runtime = (int(x) for x in out.stdout.split())
    assert (driver, runtime) == (LAUNCH_CONFIG_STREAM_OFFSET, LAUNCH_CONFIG_STREAM_OFFSET)
    offsets = {op.name: op.stream_offset for op in OPS if op.stream_offset >= 0}
    assert offsets == {"cudaLaunchKernelExC": runtime, "cuLaunchKernelEx": driver}


def test_launch_sessions_add_one_session_program_per_launch_op() -> None:
    """Sampled mode: a LAUNCH_PROBE per launch-class op (its stream argument, config offset
    and whether it is the runtime's), the placeholders the kfunc patch looks for, and the
    wanted gap between timed launches; without it, none."""
    from ingero.trace.sessions import COOKIE, IS_RETURN, KFUNC_PLACEHOLDERS

    source = bpf_source_path().read_text()
    assert "LAUNCH_PROBE(" not in program_text(source).split("\n#define LAUNCH_PROBE")[-1]
    text = program_text(source, launch_sessions=True, launch_timed_per_s=250)
    assert "#define LAUNCH_SESSIONS 1" in text and "#define LAUNCH_GAP_NS 4000000ULL" in text
    assert f"#define KFUNC_SESSION_IS_RETURN {KFUNC_PLACEHOLDERS[IS_RETURN]:#x}" in text
    assert f"#define KFUNC_SESSION_COOKIE {KFUNC_PLACEHOLDERS[COOKIE]:#x}" in text
    found = re.findall(r"^LAUNCH_PROBE\((\d+), (\d), (-1|\d+), ([01])\)$", text, re.M)
    launches = [i for i, op in enumerate(OPS) if op.launch]
    assert [int(p[0]) for p in found] == launches
    assert {OPS[i].name for i in launches} >= {"cudaLaunchKernel", "cuLaunchKernel",
                                               "cudaGraphLaunch", "cuGraphLaunch"}  # fmt: skip
    for p in found:
        op = OPS[int(p[0])]
        assert (int(p[1]), int(p[2])) == (op.stream_arg, op.stream_offset)
        assert int(p[3]) == int(op.lib == "cudart")
    with pytest.raises(ValueError, match="launch_timed_per_s"):
        program_text(source, launch_sessions=True, launch_timed_per_s=0)
    # The trampoline's offsets (sessions.TRAMPOLINE, from the kernel's BTF) where known.
    assert "#define TRAMPOLINE_" not in text
    text = program_text(source, launch_sessions=True, trampoline=(1136, 1368, 40))
    assert "#define TRAMPOLINE_0 1136\n#define TRAMPOLINE_1 1368\n#define TRAMPOLINE_2 40\n" in text


def test_a_launch_in_sampled_mode_is_one_session_program() -> None:
    i = OPS.index(next(op for op in OPS if op.name == "cudaLaunchKernel"))
    att = Attachment(i, OPS[i], "cudaLaunchKernel", 0x10)
    assert probe_names(att, sampled=True) == (f"launch_{i}", "")
    assert probe_names(att) == (f"enter_{i}", "leave_sampled")
    sync = next(j for j, op in enumerate(OPS) if op.name == "cudaStreamSynchronize")
    att = Attachment(sync, OPS[sync], "cudaStreamSynchronize", 0x20)
    assert probe_names(att, sampled=True) == (f"enter_{sync}", "leave_sampled")


def test_the_launch_flags_match_the_c_source() -> None:
    from ingero.trace.probes import LAUNCH_NAMED, OP_TIMED

    source = bpf_source_path().read_text()
    assert re.search(rf"#define LAUNCH_NAMED \(1U << {LAUNCH_NAMED.bit_length() - 1}\)", source)
    assert re.search(rf"#define OP_TIMED \(1U << {OP_TIMED.bit_length() - 1}\)", source)
    assert len(OPS) < OP_TIMED  # an op id never has the flag's bit
