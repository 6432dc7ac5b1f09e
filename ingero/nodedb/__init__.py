"""The node DB: what ``ingero trace`` (or the demo's workload generator) records and
``ingero fleet-push`` reads. One SQLite file per node, WAL mode, one writer."""

from ingero.nodedb.schema import SCHEMA_VERSION, connect, migrate

__all__ = ["SCHEMA_VERSION", "connect", "migrate"]
