"""decode: ring-buffer samples (struct event_t) to TraceEvent, and bad samples."""

from __future__ import annotations

import json
import struct

import pytest

from ingero.trace.decode import (
    EVENT_FORMAT,
    EVENT_SIZE,
    KIND_CALL,
    KIND_COMM_INIT,
    KIND_ENTER,
    KIND_EXIT,
    DecodeError,
    decode,
    unique_id_hash,
)
from ingero.trace.ops import OP_IDS


def _pack(**kw: int) -> bytes:
    f = dict(ts=1, duration_ns=2, bytes=3, comm_hash=0, comm=0, seq=0, tgid=10, tid=11, op=0,
             ret=0,
             rank=-1, nranks=-1, dtype=0, kind=KIND_CALL)  # fmt: skip
    f.update(kw)
    return EVENT_FORMAT.pack(*f.values())


def test_layout_matches_the_c_struct() -> None:
    # struct event_t: 6 u64 + 8 32-bit fields = 80 bytes, no padding.
    assert EVENT_SIZE == 80


def test_cuda_call() -> None:
    ev = decode(_pack(op=OP_IDS["cudaMemcpy"], duration_ns=1500, bytes=4096, ret=35))
    assert (ev.op, ev.source, ev.duration_ns, ev.bytes, ev.ret) == (
        "cudaMemcpy", "cuda_runtime", 1500, 4096, 35)  # fmt: skip
    assert ev.pid == 10 and ev.tid == 11
    assert ev.detail() is None


def test_nccl_call_detail() -> None:
    ev = decode(_pack(op=OP_IDS["ncclAllReduce"], comm_hash=0xABC, rank=2, nranks=8, dtype=7))
    assert ev.source == "nccl"
    assert json.loads(ev.detail() or "") == {
        "comm_hash": "0000000000000abc", "rank": 2, "nranks": 8, "datatype": "float32"}  # fmt: skip


def test_numbered_collective_carries_handle_and_seq() -> None:
    ev = decode(_pack(op=OP_IDS["ncclAllReduce"], kind=KIND_ENTER, comm=0x55AA, seq=8812,
                      comm_hash=0xABC, rank=1, nranks=4))  # fmt: skip
    assert (ev.kind, ev.comm, ev.seq, ev.op) == (KIND_ENTER, 0x55AA, 8812, "ncclAllReduce")
    assert json.loads(ev.detail() or "")["seq"] == 8812


def test_comm_init_and_exit() -> None:
    init = decode(_pack(op=OP_IDS["ncclCommInitRank"], kind=KIND_COMM_INIT, rank=0, nranks=2))
    assert init.op == "ncclCommInitRank"
    assert "datatype" not in json.loads(init.detail() or "")
    ex = decode(_pack(kind=KIND_EXIT))
    assert (ex.op, ex.source) == ("exit", "host")


def test_unknown_op_id_is_named_not_raised() -> None:
    assert decode(_pack(op=9999)).op == "op9999"


def test_short_sample_is_an_error() -> None:
    with pytest.raises(DecodeError, match="expected 80"):
        decode(b"\0" * 10)


def test_unknown_kind_is_an_error() -> None:
    with pytest.raises(DecodeError, match="unknown sample kind 9"):
        decode(_pack(kind=9))


def test_unique_id_hash_is_fnv1a_over_words() -> None:
    uid = bytes(range(128))
    h = 14695981039346656037
    for (w,) in struct.iter_unpack("<Q", uid):
        h = ((h ^ w) * 1099511628211) % 2**64
    assert unique_id_hash(uid) == h
    assert unique_id_hash(uid) != unique_id_hash(bytes(128))
    with pytest.raises(ValueError):
        unique_id_hash(b"short")
