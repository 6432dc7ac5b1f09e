"""probes.program_text and the BPF source: generated from the op table, consistent with it."""

from __future__ import annotations

import re

import pytest

from ingero.trace.aggregate import HOST_COUNTERS, NSLOTS
from ingero.trace.ops import OP_COMM_INIT, OP_OFFCPU, OPS
from ingero.trace.probes import bpf_source_path, probe_names, program_text
from ingero.trace.symbols import Attachment


def test_one_probe_pair_per_generic_op() -> None:
    text = program_text(bpf_source_path().read_text(), sample_every=16)
    assert "#define SAMPLE_EVERY 16" in text
    assert f"#define OP_OFFCPU {OP_OFFCPU}" in text
    pairs = re.findall(r"^PROBE_PAIR\((\d+), (\d), (\d), (\d), (\d), ([01]), ([01])\)$", text,
                       re.M)  # fmt: skip
    generic = [i for i, op in enumerate(OPS) if op.symbols and not op.special]
    assert [int(p[0]) for p in pairs] == generic
    for p in pairs:
        op = OPS[int(p[0])]
        assert tuple(int(x) for x in p[1:5]) == (op.bytes_arg, op.count_arg, op.dtype_arg,
                                                 op.comm_arg)  # fmt: skip
        assert int(p[5]) == int(op.always_sample)
        assert int(p[6]) == int(op.numbered)


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
