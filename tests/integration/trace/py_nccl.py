"""One rank of a job in CPython, calling the stand-in libnccl through ctypes from known lines.

Usage: py_nccl.py LIBNCCL SEED NRANKS RANK. The unique id is nccl_ranks.c's for SEED, so a
nccl_ranks process can be the other rank. After the go line: ``train`` → ``step`` runs one
allreduce, then ``train`` → ``hang`` runs another, which stays blocked while a peer never
enters it. The marked lines are printed (``NAME=LINE``) just before that second call.
"""

import ctypes
import sys

MARKS = {}


def mark(name):
    MARKS[name] = sys._getframe(1).f_lineno + 1  # the line after the call


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


lib = ctypes.CDLL(sys.argv[1])
seed, nranks, rank = (int(a) for a in sys.argv[2:5])
uid = UniqueId()
ctypes.memmove(ctypes.byref(uid), bytes((seed * 31 + i * 7 + 3) & 0xFF for i in range(128)), 128)
lib.ncclCommInitRank.argtypes = [ctypes.c_void_p, ctypes.c_int, UniqueId, ctypes.c_int]
lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                              ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]  # fmt: skip
buf = (ctypes.c_float * 16)()
comm = ctypes.c_void_p()


def step():
    mark("step")
    return lib.ncclAllReduce(buf, buf, 16, 7, 0, comm, None)  # float32, sum


def hang():
    here = sys._getframe().f_lineno
    print(" ".join(f"{k}={v}" for k, v in MARKS.items()), f"hang={here + 2}", flush=True)
    return lib.ncclAllReduce(buf, buf, 16, 7, 0, comm, None)


def train():
    mark("train_step")
    step()
    mark("train_hang")
    hang()


print("ready", flush=True)
sys.stdin.readline()
assert lib.ncclCommInitRank(ctypes.byref(comm), nranks, uid, rank) == 0
mark("module")
train()
