"""The node's NCCL communicators for one health push, read from the node DB.

``ingero trace`` writes, per interval, one ``nccl_comms`` row per process and communicator
(the sequence numbers the rank reached, what is in flight) and the sampled collectives to
``nccl_calls`` (docs/design.md, node DB). Per push this reads

- the newest ``nccl_comms`` row of each (pid, comm_hash, comm_rank) written within the last
  ``recent_intervals`` push intervals, kept only while its process lives or the row is
  from the last interval (a rank that exited is not reported as stuck), with the interval
  counts (calls, wait, dropped) summed over the rows written since the previous push;
- the ``nccl_calls`` rows written since the previous push (by rowid, so a call written
  late, after the push that its entry time belongs to, is still read once), at most
  ``max_calls_read`` of them, the newest; older ones count as dropped (the first push
  after a start has no previous push: it carries the ranks' state, no calls or counts);

and builds :class:`~ingero.otlp.collectives.CommReport` values (times in Unix ns of the
node's clock). A node DB without the tables (no NCCL tracing there, or an older tracer)
gives no communicators and no error. :func:`build_reports` is pure; :class:`CollectivesReader`
holds the cursor between pushes.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ingero.nodedb.schema import SchemaError, connect
from ingero.otlp.collectives import (
    MAX_CALLS,
    MAX_COMMS,
    CollectiveCall,
    CommReport,
    sample_seqs,
)

log = logging.getLogger(__name__)

CALLS_TABLE = "nccl_calls"
COMMS_TABLE = "nccl_comms"

# Newest row per rank of a communicator (SQLite takes the bare columns from the max(ts)
# row), with the interval counts summed over the rows written since the previous push.
_COMMS_SQL = f"""
SELECT pid, comm_hash, comm_rank, max(ts) AS ts, nranks, entered_seq, returned_seq,
       last_enter_ts, inflight_seq, inflight_op, inflight_since,
       sum(CASE WHEN rowid > :cursor THEN calls ELSE 0 END) AS calls,
       sum(CASE WHEN rowid > :cursor THEN wait_ns ELSE 0 END) AS wait_ns,
       sum(CASE WHEN rowid > :cursor THEN dropped ELSE 0 END) AS dropped
FROM {COMMS_TABLE} WHERE ts > :since
GROUP BY pid, comm_hash, comm_rank
ORDER BY ts DESC LIMIT :limit
"""
# The calls read this push: written since the previous one, the newest ``limit``.
_READ_SQL = f"""
SELECT rowid, pid, comm_hash, comm_rank, seq, op, ts_enter, ts_return, bytes
FROM {CALLS_TABLE} WHERE rowid > ? AND ts_enter > ? ORDER BY rowid DESC LIMIT ?
"""
# Per rank of the calls read: their seqs, so they are sampled before the calls are read.
_SEQS_SQL = f"""
SELECT pid, comm_hash, comm_rank, count(*) AS n, min(rowid) AS first, group_concat(seq) AS seqs
FROM ({_READ_SQL}) GROUP BY pid, comm_hash, comm_rank
"""
# The picked calls of one communicator (its ranks share the picked seqs, mostly), through
# the tracer's (comm_hash, seq) index.
_PICKED_SQL = f"""
SELECT pid, comm_hash, comm_rank, seq, op, ts_enter, ts_return, bytes FROM {CALLS_TABLE}
WHERE comm_hash = ? AND rowid >= ? AND seq IN (SELECT value FROM json_each(?))
"""


class Row(Protocol):
    """A row by column name: a dict in tests, a ``sqlite3.Row`` from the node DB."""

    def __getitem__(self, key: str, /) -> Any: ...


def _ns(ts: float | None) -> int | None:
    return None if ts is None else round(ts * 1e9)


def _key(row: Row) -> tuple[int, str, int]:
    return int(row["pid"]), str(row["comm_hash"]), int(row["comm_rank"])


def build_reports(
    comms: Iterable[Row],
    calls: Iterable[Row],
    *,
    now: float,
    fresh_s: float,
    pid_alive: Callable[[int], bool],
    unsent: Mapping[tuple[int, str, int], int] | None = None,
) -> list[CommReport]:
    """CommReports from ``nccl_comms`` rows (newest per rank, as :data:`_COMMS_SQL` picks
    them) and ``nccl_calls`` rows. A rank whose process is gone is kept only while its row
    is younger than ``fresh_s``; calls of a rank with no kept row are left out (its
    communicator's size is unknown); ``unsent`` adds the calls left out to ``dropped``."""
    by_rank: dict[tuple[int, str, int], dict[int, CollectiveCall]] = {}
    for row in calls:
        # A seq written twice (a rewritten row) is sent once; the decoder wants them unique.
        by_rank.setdefault(_key(row), {})[int(row["seq"])] = CollectiveCall(
            seq=int(row["seq"]),
            op=str(row["op"]),
            entered_ns=round(float(row["ts_enter"]) * 1e9),
            returned_ns=_ns(row["ts_return"]),
            bytes=max(0, int(row["bytes"] or 0)),
        )
    out: list[CommReport] = []
    for row in comms:
        key = _key(row)
        if now - float(row["ts"]) > fresh_s and not pid_alive(key[0]):
            continue
        sampled = by_rank.get(key, {})
        out.append(
            CommReport(
                comm_hash=key[1],
                comm_rank=key[2],
                nranks=int(row["nranks"]),
                entered_seq=int(row["entered_seq"] or 0),
                returned_seq=int(row["returned_seq"] or 0),
                calls_in_interval=int(row["calls"] or 0),
                last_enter_ns=_ns(row["last_enter_ts"]),
                inflight_seq=row["inflight_seq"],
                inflight_op=row["inflight_op"],
                inflight_since_ns=_ns(row["inflight_since"]),
                wait_ns=int(row["wait_ns"] or 0),
                dropped=int(row["dropped"] or 0) + (unsent or {}).get(key, 0),
                calls=tuple(sampled[seq] for seq in sorted(sampled)),
            )
        )
    return out


@dataclass
class _Cursor:
    calls: int = 0  # rowids already read
    comms: int = 0


class CollectivesReader:
    """Reads the node DB's NCCL tables once per push; remembers where the last push ended."""

    def __init__(
        self,
        db_path: Path,
        *,
        interval_s: float,
        recent_intervals: int,
        max_calls_read: int,
        pid_alive: Callable[[int], bool],
        timeout_s: float = 0.5,
    ) -> None:
        self.db_path = db_path
        self.interval_s = interval_s
        self.recent_s = recent_intervals * interval_s
        self.max_calls_read = max_calls_read
        self.pid_alive = pid_alive
        self.timeout_s = timeout_s
        self._cursor: _Cursor | None = None
        self._warned: str | None = None

    def read(self, now: float) -> tuple[CommReport, ...]:
        """The communicators as of ``now``; none (logged once) when the DB cannot be read
        or holds what no tracer writes: the health push goes out either way."""
        try:
            return self._read(now)
        except (sqlite3.Error, SchemaError, OSError, TypeError, ValueError) as exc:
            message = f"{self.db_path}: cannot read NCCL tables: {exc}"
            if message != self._warned:
                log.warning("%s", message)
                self._warned = message
            return ()

    def _read(self, now: float) -> tuple[CommReport, ...]:
        if not self.db_path.exists():
            return ()
        db = connect(self.db_path, readonly=True, timeout=self.timeout_s)
        conn = db.conn
        try:
            tables = {
                name
                for (name,) in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN (?, ?)",
                    (CALLS_TABLE, COMMS_TABLE),
                )
            }
            if tables != {CALLS_TABLE, COMMS_TABLE}:
                return ()
            conn.row_factory = sqlite3.Row
            calls_top = conn.execute(f"SELECT coalesce(max(rowid), 0) FROM {CALLS_TABLE}")
            comms_top = conn.execute(f"SELECT coalesce(max(rowid), 0) FROM {COMMS_TABLE}")
            top = _Cursor(int(calls_top.fetchone()[0]), int(comms_top.fetchone()[0]))
            cursor = self._cursor
            # First push, or a node DB replaced under us (rowids went back): there is no
            # previous push to count from, so this one carries the ranks' state only, and
            # every later one exactly the rows written since (counts and calls agree).
            first = cursor is None or top.calls < cursor.calls or top.comms < cursor.comms
            if first:
                cursor = top
            assert cursor is not None
            comms = conn.execute(
                _COMMS_SQL,
                {"cursor": cursor.comms, "since": now - self.recent_s, "limit": 4 * MAX_COMMS},
            ).fetchall()
            read = (cursor.calls, now - self.recent_s, self.max_calls_read)
            calls, unsent, total = self._sampled_calls(conn, read, {_key(row) for row in comms})
            if total == self.max_calls_read:  # the read was cut: the older rows go unsent
                first_read = conn.execute(f"SELECT min(rowid) FROM ({_READ_SQL})", read).fetchone()[
                    0
                ]
                for row in conn.execute(
                    f"SELECT pid, comm_hash, comm_rank, count(*) AS n FROM {CALLS_TABLE}"
                    " WHERE rowid > ? AND rowid < ? GROUP BY pid, comm_hash, comm_rank",
                    (cursor.calls, first_read),
                ):
                    unsent[_key(row)] = unsent.get(_key(row), 0) + int(row["n"])
        finally:
            conn.close()
        self._cursor = top
        reports = build_reports(
            comms,
            calls,
            now=now,
            fresh_s=self.interval_s,
            pid_alive=self.pid_alive,
            unsent=unsent,
        )
        return tuple(reports[:MAX_COMMS])

    def _sampled_calls(
        self,
        conn: sqlite3.Connection,
        read: tuple[int, float, int],
        ranks: set[tuple[int, str, int]],
    ) -> tuple[list[sqlite3.Row], dict[tuple[int, str, int], int], int]:
        """The read calls of ``ranks``, each rank's sampled as the encoder samples them (at
        most MAX_CALLS, so the encoder's own sampling nests in it); per rank how many read
        calls were left out; and how many were read in all. Only the seqs of the calls
        read cross into Python; then only the picked calls are fetched."""
        picked: dict[tuple[int, str, int], set[int]] = {}
        counts: dict[tuple[int, str, int], int] = {}
        by_comm: dict[str, tuple[int, set[int]]] = {}
        total = 0
        for row in conn.execute(_SEQS_SQL, read):
            key = _key(row)
            total += int(row["n"])
            if key not in ranks:
                continue
            seqs = sorted({int(s) for s in str(row["seqs"]).split(",")})
            picked[key] = set(sample_seqs(seqs, MAX_CALLS))
            counts[key] = int(row["n"])
            first, wanted = by_comm.get(key[1], (int(row["first"]), set()))
            by_comm[key[1]] = (min(first, int(row["first"])), wanted | picked[key])
        rows: list[sqlite3.Row] = []
        for comm_hash, (first, wanted) in by_comm.items():
            for row in conn.execute(_PICKED_SQL, (comm_hash, first, json.dumps(sorted(wanted)))):
                key = _key(row)
                if int(row["seq"]) in picked.get(key, ()):
                    rows.append(row)
        sent: dict[tuple[int, str, int], int] = {}
        for row in rows:
            sent[_key(row)] = sent.get(_key(row), 0) + 1
        return rows, {key: n - sent.get(key, 0) for key, n in counts.items()}, total
