"""probes.program_text and the BPF source: generated from the op table, consistent with it."""

from __future__ import annotations

import re

import pytest

from ingero.trace.aggregate import HOST_COUNTERS, NSLOTS
from ingero.trace.ops import OP_COMM_INIT, OP_OFFCPU, OPS, STREAM_KINDS
from ingero.trace.probes import bpf_source_path, probe_names, program_text
from ingero.trace.symbols import Attachment


def test_one_probe_pair_per_generic_op() -> None:
    text = program_text(bpf_source_path().read_text(), sample_every=16)
    assert "#define SAMPLE_EVERY 16" in text
    assert f"#define OP_OFFCPU {OP_OFFCPU}" in text
    pairs = re.findall(r"^PROBE_PAIR\((\d+), (\d), (\d), (\d), (\d), ([01]), ([01]), (\d), (\d)\)$",
                       text, re.M)  # fmt: skip
    generic = [i for i, op in enumerate(OPS) if op.symbols and not op.special]
    assert [int(p[0]) for p in pairs] == generic
    for p in pairs:
        op = OPS[int(p[0])]
        assert tuple(int(x) for x in p[1:5]) == (op.bytes_arg, op.count_arg, op.dtype_arg,
                                                 op.comm_arg)  # fmt: skip
        assert int(p[5]) == int(op.always_sample)
        assert int(p[6]) == int(op.numbered)
        assert (int(p[7]), int(p[8])) == (op.stream_arg, STREAM_KINDS[op.stream_kind])


def test_stream_kinds_match_the_c_source() -> None:
    source = bpf_source_path().read_text()
    found = {k.lower(): int(v) for k, v in re.findall(r"#define STREAM_(\w+) (\d+)", source)}
    assert found == {"none": 0, **{k: v for k, v in STREAM_KINDS.items() if k}}


def test_the_stream_argument_of_each_stream_op() -> None:
    """x86-64 slots: a dim3 by value takes two, so cudaLaunchKernel's stream is slot 8;
    cuLaunchKernel's is its 9th parameter, the third on the stack."""
    streams = {op.name: (op.stream_arg, op.stream_kind) for op in OPS if op.stream_arg}
    assert streams == {
        "cudaLaunchKernel": (8, "launch"),
        "cudaStreamSynchronize": (1, "sync"),
        "cuLaunchKernel": (9, "launch"),
        "cuLaunchCooperativeKernel": (9, "launch"),
        "cuStreamSynchronize": (1, "sync"),
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
    # Headers may not match the running kernel: only tracepoint args and uprobe registers.
    source = bpf_source_path().read_text()
    assert "bpf_probe_read_kernel" not in source
    assert "bpf_core_read" not in source.lower()
    # The task pointer is only a key for task-local storage, never dereferenced.
    for line in source.splitlines():
        if "task_struct" in line:
            assert "bpf_get_current_task_btf()" in line, line
    assert not re.search(r"\bt->", source)


def test_sample_every_must_be_positive() -> None:
    with pytest.raises(ValueError):
        program_text("", 0)
