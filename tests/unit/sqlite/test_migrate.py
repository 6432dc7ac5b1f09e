"""Versioned SQLite schemas: forward migrations, one transaction each, newer versions refused."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils

from ingero.sqlite.sqlitemigrate import SchemaError, migrate


def v1(db: sqlite_utils.Database) -> None:
    db.table("a").create({"x": int})


def v2_fails_halfway(db: sqlite_utils.Database) -> None:
    db.table("b").create({"y": int})
    raise ValueError("boom")


def version(db: sqlite_utils.Database) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


@pytest.mark.parametrize("isolation", ["", None])  # the node DB's and Echo's connection modes
def test_a_failing_step_leaves_the_previous_version_whole(
    tmp_path: Path, isolation: str | None
) -> None:
    db = sqlite_utils.Database(sqlite3.connect(tmp_path / "x.db", isolation_level=isolation))
    with pytest.raises(ValueError, match="boom"):
        migrate(db, [v1, v2_fails_halfway])
    assert version(db) == 1
    assert db.table_names() == ["a"]  # the half-built table "b" was rolled back
    assert not db.conn.in_transaction


def test_applies_pending_steps_only_and_refuses_a_newer_database(tmp_path: Path) -> None:
    db = sqlite_utils.Database(sqlite3.connect(tmp_path / "x.db"))
    assert migrate(db, [v1]) == 1
    assert migrate(db, [v1]) == 1  # nothing pending: v1 is not run twice
    db.execute("PRAGMA user_version = 5")
    with pytest.raises(SchemaError, match="schema version 5 is newer than this ingero \\(1\\)"):
        migrate(db, [v1])


def test_a_migration_another_process_finished_is_not_applied_again(tmp_path: Path) -> None:
    """Two processes open a new DB at once (the tracer and the annotate server at boot): the
    second has read version 0 when the first migrates; it reads it again under the lock."""
    path = tmp_path / "s.db"
    early = sqlite_utils.Database(sqlite3.connect(str(path), isolation_level=None))

    class Late(sqlite_utils.Database):
        raced = False

        def execute(self, sql: str, parameters: Any = None) -> sqlite3.Cursor:
            if sql == "BEGIN IMMEDIATE" and not self.raced:
                self.raced = True
                assert migrate(early, [v1]) == 1  # between this one's read and its lock
            return super().execute(sql, parameters)

    late = Late(sqlite3.connect(str(path), isolation_level=None))
    assert migrate(late, [v1]) == 1
    assert late.raced and version(late) == 1
