"""NCCL episodes in Echo (``ingero.echo.collectives``): an event's extras as the row it
folds in as, the upsert fold in any order, and the folds the ``collective_lag`` answer
makes of the rows, table-driven."""

from __future__ import annotations

import itertools
import sqlite3
import uuid
from typing import Any

import pytest
import sqlite_utils

from ingero.echo import collectives
from ingero.echo.collectives import COLUMNS, episode_row
from ingero.echo.rows import event_row
from ingero.echo.schema import MIGRATIONS
from ingero.schema.events import Event
from ingero.sqlite.sqlitemigrate import migrate

EID = "00000000-0000-4000-8000-000000000001"


def row_of(kind: str, ts: float, node: str = "n1", **extra: Any) -> dict[str, Any]:
    event = Event(kind, node, "A", ts, event_id=EID, job_id="7", rank=3, extra=extra)
    return dict(zip(COLUMNS, episode_row(event_row(event, 0.0)), strict=True))


@pytest.mark.parametrize(
    ("kind", "extra", "expected"),
    [
        (
            "peer_lag",
            {"comm_hash": "ab" * 8, "comm_rank": 41, "lag_p50_ms": 290, "state": "start"},
            {"comm_hash": "ab" * 8, "comm_rank": 41, "lag_p50_ms": 290.0, "end_ts": None},
        ),
        # the end of the episode sets end_ts; the figures still count
        (
            "peer_lag",
            {"lag_p95_ms": 1.5, "last_count": 3, "collectives": 20, "state": "end"},
            {"end_ts": 100.0, "max_lag_p95_ms": 1.5, "last_count": 3, "collectives": 20},
        ),
        # wrong types are read as missing, never a failed commit
        (
            "peer_lag",
            {"comm_rank": "41", "nranks": True, "lag_p50_ms": "slow", "bytes": 1.5, "op": 3},
            {"comm_rank": None, "nranks": None, "lag_p50_ms": None, "bytes": None, "op": None},
        ),
        (
            "collective_hang",
            {"seq": 9001, "missing_ranks": [41, 42], "missing_nodes": ["n41"], "inside_for_s": 40},
            {
                "seq": 9001,
                "missing_ranks": "[41,42]",
                "missing_nodes": '["n41"]',
                "inside_for_s": 40.0,
                "since_ts": 60.0,
            },
        ),
        (
            "collective_hang",
            {"missing_ranks": ["41"], "missing_nodes": [1], "inside_for_s": None, "state": "x"},
            {"missing_ranks": None, "missing_nodes": None, "since_ts": None, "end_ts": None},
        ),
        # ranks inside or missing listed (the first few) and counted (all)
        (
            "collective_hang",
            {"inside_ranks": [1, 2, 3], "inside_count": 60, "missing_ranks": [9]},
            {"inside_ranks": 60, "missing_count": 1, "missing_ranks": "[9]"},
        ),
        (
            "collective_hang",
            {"inside_ranks": [1, 2, 3]},
            {"inside_ranks": 3, "missing_count": None},
        ),
        (
            "collective_hang",
            {"inside_ranks": 7, "missing_count": 64},
            {"inside_ranks": 7, "missing_count": 64},
        ),
        # an end event's reason is how the episode ended; its since when the ranks went in
        (
            "collective_hang",
            {"reason": "collective_returned", "since": 70.5, "state": "end"},
            {"reason": None, "end_reason": "collective_returned", "since_ts": 70.5},
        ),
        (
            "collective_hang",
            {"reason": "missing_ranks", "since": 90.0, "inside_for_s": 20.0},
            {"reason": "missing_ranks", "end_reason": None, "since_ts": 80.0},
        ),
        (
            "peer_lag",
            {"late_count": 17, "peers_wait_p50_ms": 280, "since": 5.0},
            {"late_count": 17, "peers_wait_p50_ms": 280.0, "since_ts": None},
        ),
        # a peer_lag's inside_for_s (were one sent) says nothing about when ranks went in
        ("peer_lag", {"inside_for_s": 5.0}, {"since_ts": None, "inside_for_s": 5.0}),
        ("peer_lag", {}, {"comm_hash": None, "n_events": 1, "start_ts": 100.0, "job_id": "7"}),
    ],
)
def test_an_events_extras_become_its_episode_columns(
    kind: str, extra: dict[str, Any], expected: dict[str, Any]
) -> None:
    got = row_of(kind, 100.0, **extra)
    assert {k: got[k] for k in expected} == expected


def _fold(events: list[dict[str, Any]]) -> dict[str, Any]:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    migrate(sqlite_utils.Database(conn), MIGRATIONS)
    conn.executemany(collectives.UPSERT, [tuple(e.values()) for e in events])
    rows = conn.execute(f"SELECT {', '.join(COLUMNS)} FROM collective_episodes").fetchall()
    assert len(rows) == 1
    return dict(zip(COLUMNS, rows[0], strict=True))


LAG_EPISODE = [
    row_of("peer_lag", 1000.0, comm_rank=41, lag_p50_ms=250.0, lag_p95_ms=300.0, last_count=12),
    row_of("peer_lag", 1060.0, comm_rank=41, lag_p50_ms=290.0, lag_p95_ms=280.0, last_count=14),
    row_of("peer_lag", 1200.0, comm_rank=41, lag_p50_ms=4.0, state="end"),
]
HANG_EPISODE = [
    row_of("collective_hang", 2000.0, node="", seq=9, inside_for_s=31.0, reason="all_inside"),
    row_of("collective_hang", 2030.0, node="n4", seq=9, inside_for_s=60.0, missing_ranks=[4]),
    row_of("collective_hang", 2100.0, node="", seq=9, state="end"),
]


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        (
            LAG_EPISODE,
            {
                "start_ts": 1000.0,
                "last_ts": 1200.0,
                "end_ts": 1200.0,
                "n_events": 3,
                # all of the newest start event's figures, none of the end's
                "lag_p50_ms": 290.0,
                "lag_p95_ms": 280.0,
                "last_count": 14,
                "max_lag_p50_ms": 290.0,
                "max_lag_p95_ms": 300.0,
            },
        ),
        (
            HANG_EPISODE,
            {
                "since_ts": 1969.0,
                "end_ts": 2100.0,
                "node_id": "n4",
                "missing_ranks": "[4]",
                "inside_for_s": 60.0,
                "reason": None,  # the newest start event had none
                "n_events": 3,
            },
        ),
        # an episode seen only by its end: the end's figures, until a start event comes
        ([LAG_EPISODE[2]], {"lag_p50_ms": 4.0, "end_ts": 1200.0, "n_events": 1}),
        (
            [LAG_EPISODE[2], LAG_EPISODE[0]],
            {"lag_p50_ms": 250.0, "lag_p95_ms": 300.0, "start_ts": 1000.0, "n_events": 2},
        ),
    ],
)
def test_an_episode_folds_the_same_in_every_order(
    events: list[dict[str, Any]], expected: dict[str, Any]
) -> None:
    for order in itertools.permutations(events):
        got = _fold(list(order))
        assert {k: got[k] for k in expected} == expected, order


def test_one_event_id_in_two_clusters_is_two_episodes() -> None:
    """A sender of one cluster never folds into another cluster's episode."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    migrate(sqlite_utils.Database(conn), MIGRATIONS)
    mine = row_of("peer_lag", 10.0, lag_p50_ms=5.0)
    theirs = {**row_of("peer_lag", 20.0, lag_p50_ms=900.0), "cluster_id": "B"}
    conn.executemany(collectives.UPSERT, [tuple(mine.values()), tuple(theirs.values())])
    rows = conn.execute(
        "SELECT cluster_id, max_lag_p50_ms, n_events FROM collective_episodes ORDER BY 1"
    ).fetchall()
    assert rows == [("A", 5.0, 1), ("B", 900.0, 1)]


def folded(*episodes: list[tuple[Any, ...]]) -> sqlite3.Connection:
    """An in-memory store holding the episodes (each a list of event rows) folded."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    migrate(sqlite_utils.Database(conn), MIGRATIONS)
    conn.executemany(collectives.UPSERT, [row for ep in episodes for row in ep])
    return conn


def lag_ep(
    cluster: str = "A",
    comm_rank: int | None = 1,
    p50: float | None = 10.0,
    last: int | None = 1,
    start: float = 0.0,
    end: float | None = None,
    node: str = "n",
) -> list[tuple[Any, ...]]:
    """One peer_lag episode: its start event (and end event, if it ended)."""
    eid = str(uuid.uuid4())
    figures = {"comm_hash": "c" * 16, "comm_rank": comm_rank, "nranks": 8, "op": "allreduce"}
    figures.update(lag_p50_ms=p50, lag_p95_ms=p50, last_count=last, collectives=20)
    events = [(start + 10.0, "start", figures), (end, "end", {"comm_rank": comm_rank})]
    return [
        episode_row(
            event_row(
                Event("peer_lag", node, cluster, ts, event_id=eid, job_id="7", rank=comm_rank,
                      extra={k: v for k, v in {**extra, "state": state}.items() if v is not None}),
                0.0,
            )
        )
        for ts, state, extra in events[: 2 if end is not None else 1]
    ]  # fmt: skip


def ranked(*episodes: list[tuple[Any, ...]], window: tuple[float, float] = (0.0, 1e9)) -> Any:
    return collectives.rank_lag(folded(*episodes), "1", [], window, 100)


@pytest.mark.parametrize(
    ("episodes", "expected"),
    [
        ([], []),
        # worst lag first
        ([lag_ep(comm_rank=1, p50=5.0), lag_ep(comm_rank=2, p50=9.0)], [(2, 9.0), (1, 5.0)]),
        # equal lag: the rank last most often first, then by comm rank
        (
            [lag_ep(comm_rank=3, last=2), lag_ep(comm_rank=1, last=2), lag_ep(comm_rank=2, last=7)],
            [(2, 10.0), (1, 10.0), (3, 10.0)],
        ),
        # no lag figure at all: after every rank with one
        ([lag_ep(comm_rank=1, p50=None), lag_ep(comm_rank=2, p50=0.5)], [(2, 0.5), (1, None)]),
        # one rank, two episodes: one entry with the worst lag of both
        ([lag_ep(p50=30.0, end=50.0), lag_ep(p50=3.0, start=100.0)], [(1, 30.0)]),
        # the same comm rank in two clusters is two ranks
        ([lag_ep(cluster="B", p50=1.0), lag_ep(cluster="A", p50=2.0)], [(1, 2.0), (1, 1.0)]),
        # a rank whose events carried no comm rank is still one rank
        ([lag_ep(comm_rank=None, p50=7.0), lag_ep(comm_rank=None, p50=8.0)], [(None, 8.0)]),
    ],
)
def test_ranks_are_ranked_by_worst_lag_then_times_last(
    episodes: list[list[tuple[Any, ...]]], expected: list[tuple[int, float | None]]
) -> None:
    got = ranked(*episodes)
    assert [(r["comm_rank"], r["max_lag_p50_ms"]) for r in got] == expected


def test_a_ranks_figures_are_its_newest_episodes_and_episodes_are_counted() -> None:
    older = lag_ep(p50=30.0, last=9, start=0.0, end=50.0, node="old-node")
    newer = lag_ep(p50=3.0, last=2, start=100.0, node="new-node")
    (rank,) = ranked(older, newer)
    assert (rank["node_id"], rank["lag_p50_ms"], rank["times_last"]) == ("new-node", 3.0, 2)
    assert (rank["episodes"], rank["open_episodes"], rank["closed_episodes"]) == (2, 1, 1)
    assert (rank["first_seen"], rank["last_seen"]) == (10.0, 110.0)
    # only the episodes that overlap the window count
    (early,) = ranked(older, newer, window=(0.0, 60.0))
    assert (early["node_id"], early["episodes"], early["max_lag_p50_ms"]) == ("old-node", 1, 30.0)
    assert ranked(older, newer, window=(60.0, 100.0)) == []


def hang_ep(
    seq: int, inside_for: float | None, end: float | None, missing: list[int] | None
) -> list[tuple[Any, ...]]:
    eid = str(uuid.uuid4())
    extra: dict[str, Any] = {"comm_hash": "c" * 16, "seq": seq, "state": "start"}
    if inside_for is not None:
        extra["inside_for_s"] = inside_for
    if missing is not None:
        extra["missing_ranks"] = missing
    rows = [row_of_event("collective_hang", 500.0 + seq, eid, extra)]
    if end is not None:
        rows.append(row_of_event("collective_hang", end, eid, {"state": "end"}))
    return rows


def row_of_event(kind: str, ts: float, eid: str, extra: dict[str, Any]) -> tuple[Any, ...]:
    return episode_row(
        event_row(Event(kind, "", "A", ts, event_id=eid, job_id="7", extra=extra), 0)
    )


def test_hangs_open_first_then_newest_with_their_ranks() -> None:
    conn = folded(
        hang_ep(1, 400.0, 700.0, [3]),
        hang_ep(2, 202.0, None, [5, 6]),
        hang_ep(3, 303.0, None, None),
        hang_ep(4, None, 900.0, []),
    )
    got = collectives.hangs(conn, "1", [], (0.0, 1e9), 100)
    assert [(h["seq"], h["open"], h["missing_ranks"], h["since"]) for h in got] == [
        (2, True, [5, 6], 300.0),
        (3, True, [], 200.0),
        (4, False, [], 504.0),  # no inside_for_s ever: since its detection
        (1, False, [3], 101.0),
    ]
    assert got[0]["node_id"] is None and got[3]["ended"] == 700.0
    assert [h["seq"] for h in collectives.hangs(conn, "1", [], (0.0, 1e9), 2)] == [2, 3]
    # an open hang counts until its last event, an ended one until its end
    assert [h["seq"] for h in collectives.hangs(conn, "1", [], (600.0, 1e9), 9)] == [4, 1]


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ([], []),
        (
            [
                ("A", "n1", 10.0, '{"offset_ms": -30.0, "bound_ms": 10.0, "state": "start"}'),
                ("A", "n1", 20.0, '{"offset_ms": 2.0, "state": "end"}'),
                ("A", "n2", 15.0, '{"offset_ms": 12.0, "uncertainty_ms": 1.0}'),
            ],
            [("n1", 2.0, 30.0, False, 2), ("n2", 12.0, 12.0, True, 1)],
        ),
        # out of order: the newest event still wins; a bad offset is no offset
        (
            [
                ("A", "n1", 20.0, '{"offset_ms": "far", "state": "start"}'),
                ("A", "n1", 10.0, '{"offset_ms": 50.0, "state": "end"}'),
            ],
            [("n1", None, 50.0, True, 2)],
        ),
        ([("A", "n1", 1.0, None)], [("n1", None, None, True, 1)]),
    ],
)
def test_clock_skew_per_node(
    events: list[tuple[str, str, float, str | None]],
    expected: list[tuple[str, float | None, float | None, bool, int]],
) -> None:
    got = collectives.clock_skew(events)
    assert [
        (n["node_id"], n["offset_ms"], n["max_abs_offset_ms"], n["open"], n["events"]) for n in got
    ] == expected
