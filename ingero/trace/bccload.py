"""Load Debian's BCC bindings (python3-bpfcc) into any interpreter, venvs included.

Only the ``bcc`` package is loaded from the Debian path: putting the whole of
dist-packages on ``sys.path`` would shadow the venv's own packages. The PyPI package
named ``bcc`` is an unrelated library and is never used.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

DEBIAN_BCC_DIRS = (Path("/usr/lib/python3/dist-packages/bcc"),)


class BccUnavailable(RuntimeError):
    """python3-bpfcc (or its libbcc) is not installed or cannot load."""


def find_bcc_dir(candidates: tuple[Path, ...] = DEBIAN_BCC_DIRS) -> Path | None:
    for path in candidates:
        if (path / "__init__.py").is_file():
            return path
    return None


def load_bcc(candidates: tuple[Path, ...] = DEBIAN_BCC_DIRS) -> ModuleType:
    """Return the ``bcc`` module, importing it from the Debian path on first use."""
    loaded = sys.modules.get("bcc")
    if loaded is not None and hasattr(loaded, "BPF"):
        return loaded
    directory = find_bcc_dir(candidates)
    if directory is None:
        raise BccUnavailable(
            "BCC Python bindings not found (install Debian's python3-bpfcc; "
            "the PyPI package named 'bcc' is unrelated)"
        )
    spec = importlib.util.spec_from_file_location(
        "bcc", directory / "__init__.py", submodule_search_locations=[str(directory)]
    )
    if spec is None or spec.loader is None:
        raise BccUnavailable(f"cannot import BCC from {directory}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bcc"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # libbcc.so.0 missing, ABI mismatch, …: one clear message
        del sys.modules["bcc"]
        raise BccUnavailable(f"BCC from {directory} failed to load: {exc}") from exc
    return module
