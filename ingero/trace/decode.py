"""Decode ring-buffer samples (``struct event_t`` in bpf/ingero.bpf.c) into typed events."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, replace

from ingero.trace.ops import OPS, op_name

# Must match struct event_t: 6 u64 then 8 32-bit fields, little-endian, no padding.
EVENT_FORMAT = struct.Struct("<QQQQQQIIIiiiII")
EVENT_SIZE = EVENT_FORMAT.size

KIND_CALL = 0
KIND_EXIT = 1
KIND_COMM_INIT = 2
KIND_NEW = 3  # first traced call of a process
KIND_ENTER = 4  # arrival of a numbered NCCL collective (ts is its entry time)
KINDS = (KIND_CALL, KIND_EXIT, KIND_COMM_INIT, KIND_NEW, KIND_ENTER)

NCCL_DTYPES = (
    "int8", "uint8", "int32", "uint32", "int64", "uint64",
    "float16", "float32", "float64", "bfloat16", "fp8e4m3", "fp8e5m2",
)  # fmt: skip


FNV_OFFSET = 14695981039346656037
FNV_PRIME = 1099511628211


def unique_id_hash(unique_id: bytes) -> int:
    """The communicator hash the kernel computes from a 128-byte ncclUniqueId.

    FNV-1a over the sixteen little-endian 64-bit words: every rank of a communicator
    receives the same id, so every rank reports the same hash.
    """
    if len(unique_id) != 128:
        raise ValueError(f"an ncclUniqueId has 128 bytes, got {len(unique_id)}")
    h = FNV_OFFSET
    for (word,) in struct.iter_unpack("<Q", unique_id):
        h = ((h ^ word) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


# struct stack_event_t: event_t, then u32 nnative, npy, py_state, pad, MAX_NATIVE u64
# return addresses and MAX_PY (code, instr) u64 pairs.
MAX_NATIVE = 32
MAX_PY = 32
STACK_HEAD = struct.Struct("<IIII")
STACK_SIZE = EVENT_SIZE + STACK_HEAD.size + 8 * MAX_NATIVE + 16 * MAX_PY
PY_NONE, PY_OK, PY_TRUNCATED, PY_FAULT, PY_NO_THREAD = range(5)


class DecodeError(ValueError):
    """A sample does not have the expected size or fields."""


@dataclass(frozen=True)
class TraceEvent:
    ts_ns: int  # CLOCK_MONOTONIC (bpf_ktime_get_ns)
    duration_ns: int
    bytes: int
    comm_hash: int
    comm: int  # NCCL communicator handle (0: none)
    seq: int  # collective sequence number on the communicator (0: not numbered)
    pid: int
    tid: int
    op_id: int
    ret: int
    rank: int
    nranks: int
    dtype: int
    kind: int
    # The caller's user stack (return addresses, innermost first) and, for a CPython
    # thread, its (code object, instruction) frames; None: no stack captured.
    native: tuple[int, ...] | None = None
    py: tuple[tuple[int, int], ...] = ()
    py_state: int = PY_NONE

    @property
    def op(self) -> str:
        if self.kind == KIND_EXIT:
            return "exit"
        if self.kind == KIND_NEW:
            return "start"
        return op_name(self.op_id)

    @property
    def source(self) -> str:
        if self.kind in (KIND_EXIT, KIND_NEW):
            return "host"
        return OPS[self.op_id].source if 0 <= self.op_id < len(OPS) else "unknown"

    def detail(self) -> str | None:
        """Op-specific fields as JSON (NCCL communicator, rank, datatype), or None."""
        d: dict[str, object] = {}
        if self.comm_hash:
            d["comm_hash"] = f"{self.comm_hash:016x}"
        if self.rank >= 0:
            d["rank"] = self.rank
        if self.nranks >= 0:
            d["nranks"] = self.nranks
        if self.seq:
            d["seq"] = self.seq
        if self.kind == KIND_CALL and 0 <= self.op_id < len(OPS) and OPS[self.op_id].dtype_arg:
            d["datatype"] = (
                NCCL_DTYPES[self.dtype] if self.dtype < len(NCCL_DTYPES) else str(self.dtype)
            )
        return json.dumps(d, sort_keys=True) if d else None


def decode(data: bytes) -> TraceEvent:
    """One sample (with its stack when it carries one); raises DecodeError on any size but
    the two the program writes, an unknown kind or frame counts past their arrays."""
    if len(data) not in (EVENT_SIZE, STACK_SIZE):
        raise DecodeError(f"sample of {len(data)} bytes, expected {EVENT_SIZE} or {STACK_SIZE}")
    fields = EVENT_FORMAT.unpack_from(data)
    if fields[-1] not in KINDS:
        raise DecodeError(f"unknown sample kind {fields[-1]}")
    if len(data) == EVENT_SIZE:
        return TraceEvent(*fields)
    nnative, npy, state, _ = STACK_HEAD.unpack_from(data, EVENT_SIZE)
    if nnative > MAX_NATIVE or npy > MAX_PY or state > PY_NO_THREAD:
        raise DecodeError(f"stack of {nnative} native and {npy} Python frames (state {state})")
    at = EVENT_SIZE + STACK_HEAD.size
    native = struct.unpack_from(f"<{nnative}Q", data, at)
    pairs = struct.unpack_from(f"<{2 * npy}Q", data, at + 8 * MAX_NATIVE)
    py = tuple(zip(pairs[::2], pairs[1::2], strict=True))
    return replace(TraceEvent(*fields), native=native, py=py, py_state=state)
