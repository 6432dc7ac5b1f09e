"""A CPython workload with known lines, for the stack tests (any version 3.10+).

``wait``: three threads block in ``leaf`` (called from a method, called from ``outer``)
and the main thread in ``<module>``, until a line arrives on stdin.
``recurse N``: one thread recurses N deep, then blocks the same way.
``cuda LIB N``: after the go line, ``outer`` → ``Model.forward`` → ``leaf`` calls
``cudaStreamSynchronize`` of LIB through ctypes N times, in three threads (``late LIB N``:
in one thread, whose first call is its first traced call).
Each marked line's number is printed (``NAME=LINE``) so the test never hard-codes them.
"""

import ctypes
import sys
import threading
import time

MARKS = {}


def mark(name):
    MARKS[name] = sys._getframe(1).f_lineno + 1  # the line after the call


ev = threading.Event()
lib = None


def leaf(n):
    x = 1
    if lib is None:
        mark("leaf")
        ev.wait()
        return x
    for _ in range(n):
        mark("leaf")
        lib.cudaStreamSynchronize(None)
        time.sleep(0.001)  # a training step's pace: the tracer maps new threads meanwhile
    return x


class Model:
    def forward(self, n):
        mark("forward")
        return leaf(n)


def outer(n):
    mark("outer")
    return Model().forward(n)


def recurse(depth):
    if depth <= 0:
        mark("bottom")
        return outer(0)
    mark("recurse")
    return recurse(depth - 1)


mode = sys.argv[1]
if mode in ("cuda", "late"):
    lib = ctypes.CDLL(sys.argv[2])
    lib.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
    n = int(sys.argv[3])
    target, args = outer, (n,)
elif mode == "recurse":
    target, args = recurse, (int(sys.argv[2]),)
else:
    target, args = outer, (0,)
nthreads = 1 if mode in ("recurse", "late") else 3
threads = [threading.Thread(target=target, args=args) for _ in range(nthreads)]
if mode not in ("cuda", "late"):
    for t in threads:
        t.start()
    while len(MARKS) < (5 if mode == "recurse" else 3):
        ev.wait(0.01)
    here = sys._getframe().f_lineno
    print(" ".join(f"{k}={v}" for k, v in MARKS.items()), f"module={here + 2}", flush=True)
    sys.stdin.readline()
    ev.set()
else:
    mark("module")
    print("ready", flush=True)
    sys.stdin.readline()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(" ".join(f"{k}={v}" for k, v in MARKS.items()), flush=True)
