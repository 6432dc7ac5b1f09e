"""Far more sampled calls than a tracer can read: ``cudaStreamSynchronize`` of LIB through
ctypes in a tight loop, from ``flood`` ← ``<module>``, after a "go" line and until a
"stop" line on stdin. Prints "ready", then the calls made at the end."""

import ctypes
import sys
import threading

lib = ctypes.CDLL(sys.argv[1])
stop = threading.Event()


def flood():
    n = 0
    while not stop.is_set():
        for _ in range(1000):
            lib.cudaStreamSynchronize(None)
        n += 1000
    return n


print("ready", flush=True)
sys.stdin.readline()
threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
print(f"calls={flood()}", flush=True)
