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
- aligned by sequence number across the ranks of a communicator (:func:`plan_samples`):
  a call past the last one every rank of it on the node has reached waits for the next
  push (one push at most), and one stride samples all of them, so the ranks send the same
  sequence numbers in a push even when one rank's rows were written after the push read
  the others';

and builds :class:`~ingero.otlp.collectives.CommReport` values (times in Unix ns of the
node's clock). A node DB without the tables (no NCCL tracing there, or an older tracer)
gives no communicators and no error. :func:`build_reports` is pure; :class:`CollectivesReader`
holds the cursor between pushes.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ingero.nodedb import nccl
from ingero.nodedb.schema import SchemaError, connect
from ingero.otlp.collectives import (
    MAX_CALLS,
    MAX_COMMS,
    CollectiveCall,
    CommReport,
    sample_seqs,
    shared_stride,
)

log = logging.getLogger(__name__)

Key = tuple[int, str, int]  # (pid, comm_hash, comm_rank)


class Row(Protocol):
    """A row by column name: a dict in tests, a ``sqlite3.Row`` from the node DB."""

    def __getitem__(self, key: str, /) -> Any: ...


def _ns(ts: float | None) -> int | None:
    return None if ts is None else round(ts * 1e9)


def _key(row: Row) -> Key:
    return int(row["pid"]), str(row["comm_hash"]), int(row["comm_rank"])


def _fresh(row: Row, now: float, fresh_s: float, pid_alive: Callable[[int], bool]) -> bool:
    """A rank is reported while its process lives or its row is younger than ``fresh_s``."""
    return now - float(row["ts"]) <= fresh_s or pid_alive(_key(row)[0])


def build_reports(
    comms: Iterable[Row],
    calls: Iterable[Row],
    *,
    now: float,
    fresh_s: float,
    pid_alive: Callable[[int], bool],
    unsent: Mapping[Key, int] | None = None,
) -> list[CommReport]:
    """CommReports from ``nccl_comms`` rows (newest per rank, as
    :func:`ingero.nodedb.nccl.newest_comms` picks them) and ``nccl_calls`` rows. A rank
    whose process is gone is kept only while its row is younger than ``fresh_s``; calls of
    a rank with no kept row are left out (its communicator's size is unknown); ``unsent``
    adds the calls left out to ``dropped``."""
    by_rank: dict[Key, dict[int, CollectiveCall]] = {}
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
        if not _fresh(row, now, fresh_s, pid_alive):
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
                as_of_ns=_ns(row["ts"]),
            )
        )
    return out


@dataclass(frozen=True)
class SamplePlan:
    """What one push sends of the calls it read, per rank (see :func:`plan_samples`)."""

    window: dict[Key, list[int]]  # seqs this push covers: sampled or counted dropped
    picked: dict[Key, list[int]]  # the sampled ones among them
    held: dict[Key, list[int]]  # read, past the communicator's cut: the next push's
    reached: dict[Key, int]  # the highest seq read per rank so far


def plan_samples(
    read: Mapping[Key, Sequence[int]],
    held: Mapping[Key, Sequence[int]],
    reached: Mapping[Key, int],
    ranks: Iterable[Key],
    limit: int = MAX_CALLS,
) -> SamplePlan:
    """Aligns the ranks of each communicator by sequence number, then samples them with one
    stride. ``read`` is each rank's seqs read this push (increasing), ``held`` those the
    previous push held back, ``reached`` the highest seq read per rank before, ``ranks``
    the ranks reported. A communicator's cut is the lowest seq its reported ranks have
    all reached; a rank's read seqs past it are held for the next push, where they go
    whatever the cut (a rank that stopped, or lags a whole push, delays the others by one
    push at most). Without the cut, a push that read rank 0's interval but not yet rank
    1's would carry their calls of different intervals, with no sequence number shared."""
    ranks = set(ranks)
    top = dict(reached)
    for key, seqs in read.items():
        if seqs:
            top[key] = max(top.get(key, 0), max(seqs))
    cuts: dict[str, int] = {}
    for key in ranks:
        if key in top:  # a rank that never wrote a call holds no one back
            cuts[key[1]] = min(cuts.get(key[1], top[key]), top[key])
    window: dict[Key, list[int]] = {}
    later: dict[Key, list[int]] = {}
    for key in ranks:
        new = read.get(key, ())
        cut = cuts.get(key[1], 0)
        window[key] = sorted({*held.get(key, ()), *(s for s in new if s <= cut)})
        waiting = sorted({s for s in new if s > cut})
        if waiting:
            later[key] = waiting
    by_comm: dict[str, list[list[int]]] = {}
    for key, seqs in window.items():
        by_comm.setdefault(key[1], []).append(seqs)
    strides = {h: shared_stride(lists, limit) for h, lists in by_comm.items()}
    picked = {key: sample_seqs(seqs, limit, strides[key[1]]) for key, seqs in window.items()}
    return SamplePlan(
        window=window,
        picked=picked,
        held=later,
        reached={key: top[key] for key in ranks if key in top},
    )


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
        # Seqs read but past their communicator's cut, per rank: (lowest rowid read with
        # them, seqs); and the highest seq read per rank (plan_samples).
        self._held: dict[Key, tuple[int, list[int]]] = {}
        self._reached: dict[Key, int] = {}
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
            if not nccl.has_tables(conn):
                return ()
            conn.row_factory = sqlite3.Row
            top = _Cursor(*nccl.top_rowids(conn))
            cursor = self._cursor
            # First push, or a node DB replaced under us (rowids went back): there is no
            # previous push to count from, so this one carries the ranks' state only, and
            # every later one exactly the rows written since (counts and calls agree).
            first = cursor is None or top.calls < cursor.calls or top.comms < cursor.comms
            if first:
                cursor = top
                self._held = {}
                self._reached = {
                    _key(row): int(row["seq"])
                    for row in nccl.reached(conn, cursor.calls, now - self.recent_s)
                }
            assert cursor is not None
            comms = nccl.newest_comms(conn, cursor.comms, now - self.recent_s, 4 * MAX_COMMS)
            ranks = {
                _key(row) for row in comms if _fresh(row, now, self.interval_s, self.pid_alive)
            }
            read = (cursor.calls, now - self.recent_s, self.max_calls_read)
            calls, unsent, total = self._sampled_calls(conn, read, ranks)
            if total == self.max_calls_read:  # the read was cut: the older rows go unsent
                for row in nccl.unsent(conn, read):
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
        read: nccl.Read,
        ranks: set[Key],
    ) -> tuple[list[sqlite3.Row], dict[Key, int], int]:
        """The calls of ``ranks`` this push sends, as :func:`plan_samples` aligns and samples
        them (at most MAX_CALLS each, so the encoder's own sampling nests in it); per rank
        how many of its window were left out; and how many calls were read in all. Only
        the seqs of the calls read cross into Python; then only the picked calls are
        fetched."""
        seqs: dict[Key, list[int]] = {}
        firsts: dict[Key, int] = {}
        total = 0
        for row in nccl.call_seqs(conn, read):
            key = _key(row)
            total += int(row["n"])
            if key in ranks:
                seqs[key] = sorted({int(s) for s in str(row["seqs"]).split(",")})
                firsts[key] = int(row["first"])
        held = {key: h for key, h in self._held.items() if key in ranks}
        plan = plan_samples(
            seqs, {key: h[1] for key, h in held.items()}, self._reached, ranks, MAX_CALLS
        )
        # The rows of held seqs were read before this push's: the lowest rowid to look from.
        for key, (first, _) in held.items():
            firsts[key] = min(first, firsts.get(key, first))
        self._held = {key: (firsts[key], later) for key, later in plan.held.items()}
        self._reached = plan.reached
        by_comm: dict[str, tuple[int, set[int]]] = {}
        for key, seqs_sent in plan.picked.items():
            if seqs_sent:
                first, wanted = by_comm.get(key[1], (firsts[key], set()))
                by_comm[key[1]] = (min(first, firsts[key]), wanted | set(seqs_sent))
        picked = {key: set(p) for key, p in plan.picked.items()}
        rows: list[sqlite3.Row] = []
        sent: dict[Key, set[int]] = {}
        for comm_hash, (first, wanted) in by_comm.items():
            for row in nccl.picked(conn, comm_hash, first, json.dumps(sorted(wanted))):
                key = _key(row)
                if int(row["seq"]) in picked.get(key, ()):
                    rows.append(row)
                    sent.setdefault(key, set()).add(int(row["seq"]))
        unsent = {key: len(w) - len(sent.get(key, ())) for key, w in plan.window.items()}
        return rows, unsent, total
