"""C++ symbol names as a person reads them: ``c10::cuda::CUDAStream::synchronize() const``
for ``_ZNK3c104cuda10CUDAStream11synchronizeEv``.

The demangler is libstdc++'s own ``__cxa_demangle`` (the one ``c++filt`` and gdb use), called
through ctypes: every node that runs a CUDA job has libstdc++, and a second demangler
written here would drift from the compiler's mangling. Where libstdc++ cannot be loaded, or
a name does not demangle, the name is returned as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any

# Names kept demangled (a process's hot stacks name a few hundred functions).
CACHE = 4096


@functools.cache
def _cxa() -> tuple[Any, Any] | None:
    try:
        std = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
        libc = ctypes.CDLL(None)
        fn = std.__cxa_demangle
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    free = libc.free
    free.argtypes = [ctypes.c_void_p]
    free.restype = None
    return fn, free


@functools.lru_cache(maxsize=CACHE)
def demangle(name: str) -> str:
    """The demangled ``name`` when it is a mangled C++ name, else ``name``."""
    if not name.startswith("_Z"):
        return name
    cxa = _cxa()
    if cxa is None:
        return name
    fn, free = cxa
    status = ctypes.c_int(-1)
    # Clones (".isra.0", ".constprop.0", ".localalias") carry a suffix the demangler keeps.
    out = fn(name.encode(), None, None, ctypes.byref(status))
    if not out:
        return name
    try:
        text = ctypes.string_at(out).decode("utf-8", "replace")
    finally:
        free(out)
    return text if status.value == 0 else name
