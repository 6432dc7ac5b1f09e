"""The newest stack snapshot kept beside the node DB (``ingero.nodedb.sidefile``): written
whole and atomically, read back only when it is one, described in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingero.nodedb import sidefile
from ingero.schema.events import Event

FRAMES = [
    {"kind": "native", "function": "clock_nanosleep", "lib": "/usr/lib/libc.so.6"},
    {"kind": "py", "function": "read", "file": "data/loader.py", "line": 212},
    {"kind": "py", "function": "__next__", "file": "data/loader.py", "line": 88},
]


def event(**extra: object) -> Event:
    return Event(
        "stack_snapshot",
        "gpu07",
        "c1",
        1000.0,
        job_id="42",
        rank=5,
        extra={"trigger": "collective_hang", "op": "ncclAllReduce", "seq": 9001, **extra},
    )


def test_written_read_and_described(tmp_path: Path) -> None:
    db = tmp_path / "node.db"
    stacks = [
        {"pid": 1, "rank": 5, "frames": [], "reason": "py-spy: Permission denied"},
        {"pid": 2, "rank": 5, "frames": FRAMES},
    ]
    sidefile.write(db, event(for_s=45.4, stacks=stacks).to_dict())
    assert sidefile.path_for(db) == tmp_path / "node.db-snapshot.json"
    data = sidefile.read(db)
    assert data is not None and data["stacks"] == stacks
    # the first thread with frames answers, its Python frames first
    assert sidefile.describe(data) == (
        "the job is hung in ncclAllReduce #9001; rank 5 on gpu07 has been in read at"
        " data/loader.py:212 ← __next__ at data/loader.py:88 for 45 s"
    )
    assert sidefile.recent(db, 999.0, "42") == data
    assert sidefile.recent(db, 1001.0, "42") is None  # older than the window
    assert sidefile.recent(db, 999.0, "43") is None  # another job's


@pytest.mark.parametrize(
    ("trigger", "head"),
    [
        ("peer_lag", "rank 5 enters ncclAllReduce late behind its peers"),
        ("stalled", "node gpu07 launches nothing while its job runs"),
    ],
)
def test_each_trigger_has_its_words(tmp_path: Path, trigger: str, head: str) -> None:
    data = event(trigger=trigger, stacks=[{"pid": 2, "rank": 5, "frames": FRAMES}]).to_dict()
    assert sidefile.describe(data).startswith(f"{head}; rank 5 on gpu07 has been in read at")


def test_no_thread_read_says_why(tmp_path: Path) -> None:
    data = event(stacks=[{"pid": 1, "frames": "bad"}, 7]).to_dict()
    assert sidefile.describe(data) == "stack snapshot of node gpu07: no thread could be read"


@pytest.mark.parametrize(
    "text",
    ["", "not json", "[]", '{"type": "straggler_state", "timestamp": 1}', '{"type":'
     ' "stack_snapshot", "timestamp": "x"}', " " * (sidefile.MAX_BYTES + 1)],
)  # fmt: skip
def test_what_is_not_a_snapshot_is_none(tmp_path: Path, text: str) -> None:
    db = tmp_path / "node.db"
    assert sidefile.read(db) is None  # none kept
    sidefile.path_for(db).write_text(text)
    assert sidefile.read(db) is None
