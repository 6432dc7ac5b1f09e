"""SQLite schemas versioned with ``PRAGMA user_version``: the node DB and Echo's store.

Each schema is a list of forward migrations (index i takes version i to i + 1), applied in
order, each in its own transaction so a crash never leaves a half-built version behind.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sqlite_utils

Migration = Callable[[sqlite_utils.Database], None]


class SchemaError(RuntimeError):
    """The database was written by a newer ingero (or is not the database expected)."""


def migrate(db: sqlite_utils.Database, migrations: Sequence[Migration]) -> int:
    """Apply the pending migrations; returns the resulting version (``len(migrations)``)."""
    target = len(migrations)
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version > target:
        raise SchemaError(f"schema version {version} is newer than this ingero ({target})")
    while version < target:
        # An explicit transaction: Python's sqlite3 opens none for DDL on its own.
        db.execute("BEGIN IMMEDIATE")
        try:
            # Read again under the write lock: two processes opening a new DB at once (the
            # tracer and the annotate server at boot) must not both create version 1.
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
            if version > target:
                raise SchemaError(f"schema version {version} is newer than this ingero ({target})")
            if version == target:
                db.execute("COMMIT")
                break
            migrations[version](db)
            db.execute(f"PRAGMA user_version = {version + 1}")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        version += 1
    return version
