"""The node DB: what ``ingero trace`` (or the demo's workload generator) records and
``ingero fleet-push`` reads. One SQLite file per node, WAL mode, one writer.

This package is the node's contract, as ``ingero.otlp`` is the wire's: the schema
(``schema``), the one writer (``writer``), every read of its tables, one module per concept
(``tables``, ``window``, ``intervals``, ``gpu_rows``, ``nccl``, ``stacks``, ``marks``,
``processes``), the op vocabulary (``ops``), the merged DB (``merged``) and the file kept
beside the DB (``sidefile``). No SQL on its tables lies anywhere else
(tests/unit/project/test_layers.py).

:data:`DEFAULT_PATH` is where every command looks for it unless told otherwise; it is
defined here, and importing it stays cheap (the schema module, which loads sqlite-utils,
is imported only when one of its names is used).
"""

from __future__ import annotations

from typing import Any

DEFAULT_PATH = "/var/lib/ingero/ingero.db"
# The newest node DB version this ingero writes and reads (readers refuse a newer one);
# here, so a reader that needs only the version check (``ingero check --health``, run by
# NHC) does not load sqlite-utils, which loads numpy.
SCHEMA_VERSION = 7

__all__ = ["DEFAULT_PATH", "SCHEMA_VERSION", "connect", "migrate"]


def __getattr__(name: str) -> Any:
    if name in ("connect", "migrate"):
        from ingero.nodedb import schema

        return getattr(schema, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
