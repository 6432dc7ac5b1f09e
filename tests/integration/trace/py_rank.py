"""One rank of the stand-in NCCL job as a CPython process: the stand-in libnccl
(fake_libnccl.c) through ctypes, as a training script reaches NCCL through its framework.

Usage: py_rank.py LIBNCCL RANK NRANKS SEED STOP_FILE

Loads the library, prints "ready" and waits for a line on stdin; then all-reduces in a loop
until STOP_FILE exists, when it prints "stopped=N" (the collectives it issued) and waits in
``wait_for_batch`` for ever, as a rank stuck in its data loader does: the collective the
others are inside never sees it. The unique id is built from SEED as nccl_ranks.c builds it.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

NCCL_UNIQUE_ID_BYTES = 128
NCCL_FLOAT32, NCCL_SUM = 7, 0


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_ubyte * NCCL_UNIQUE_ID_BYTES)]


def make_id(seed: int) -> UniqueId:
    uid = UniqueId()
    for i in range(NCCL_UNIQUE_ID_BYTES):
        uid.internal[i] = (seed * 31 + i * 7 + 3) & 0xFF
    return uid


def wait_for_batch() -> None:
    """The data loader that never delivers."""
    while True:
        time.sleep(3600)  # WAIT_LINE: where the rank is when the others hang


def train(nccl: ctypes.CDLL, comm: ctypes.c_void_p, stop_file: str) -> None:
    send, recv = (ctypes.c_float * 4096)(), (ctypes.c_float * 4096)()
    issued = 0
    while True:
        if os.path.exists(stop_file):
            print(f"stopped={issued}", flush=True)
            wait_for_batch()  # TRAIN_LINE: the caller's line
        rc = nccl.ncclAllReduce(
            send, recv, ctypes.c_size_t(1000), NCCL_FLOAT32, NCCL_SUM, comm, None
        )
        if rc != 0:
            sys.exit(f"ncclAllReduce: {rc}")
        issued += 1


def main() -> None:
    lib, rank, nranks, seed, stop_file = sys.argv[1:6]
    nccl = ctypes.CDLL(lib)
    nccl.ncclCommInitRank.argtypes = [
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_int,
        UniqueId,
        ctypes.c_int,
    ]
    nccl.ncclAllReduce.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
        ctypes.c_void_p, ctypes.c_void_p,
    ]  # fmt: skip
    print("ready", flush=True)
    sys.stdin.readline()
    comm = ctypes.c_void_p()
    rc = nccl.ncclCommInitRank(ctypes.byref(comm), int(nranks), make_id(int(seed)), int(rank))
    if rc != 0:
        sys.exit(f"ncclCommInitRank: {rc}")
    train(nccl, comm, stop_file)


if __name__ == "__main__":
    main()
