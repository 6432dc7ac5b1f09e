"""Clock offset to Fleet from push round trips, and the clock_skew episode (table-driven)."""

from __future__ import annotations

import pytest

from ingero.otlp.collectives import ClockOffset
from ingero.push.clock_offset import (
    JUMP_SLACK,
    ClockEstimator,
    SkewEpisode,
    round_trip_offset,
    skew_event,
)

# Unix seconds as floats resolve ~0.24 µs near 1.7e9: compare to a microsecond.
US = 1e-6


def near(x: float) -> object:
    return pytest.approx(x, abs=US)


# (name, true offset of Fleet's clock to the node's (s), request leg (s), reply leg (s))
ROUND_TRIPS = [
    ("symmetric", 0.0, 0.001, 0.001),
    ("fleet ahead", 0.250, 0.002, 0.002),
    ("fleet behind", -0.040, 0.0005, 0.0005),
    ("slow request leg", 0.0, 0.030, 0.001),
    ("slow reply leg", 0.0, 0.001, 0.030),
    ("asymmetric and skewed", 0.015, 0.020, 0.0002),
]


@pytest.mark.parametrize(
    ("name", "true", "up", "down"), ROUND_TRIPS, ids=[r[0] for r in ROUND_TRIPS]
)
def test_one_round_trip_bounds_the_true_offset(
    name: str, true: float, up: float, down: float
) -> None:
    sent = 1_700_000_000.0
    # Fleet reads its clock when the request arrives: node time sent + up, Fleet's + true.
    got = round_trip_offset(sent, sent + up + down, sent + up + true)
    assert got.uncertainty_s == near((up + down) / 2)
    assert abs(got.offset_s - true) <= got.uncertainty_s + US
    # The error is the asymmetry, nothing else.
    assert got.offset_s - true == near((up - down) / 2)


def test_a_reply_before_its_push_is_refused() -> None:
    with pytest.raises(ValueError, match="before its push"):
        round_trip_offset(10.0, 9.0, 10.0)


def feed(
    est: ClockEstimator, trips: list[tuple[float, float, float, float | None]]
) -> list[ClockOffset | None]:
    """(mono, true offset, request leg, reply leg) per push; server_time None when offset is."""
    out = []
    for mono, true, up, down in trips:
        sent = 1_700_000_000.0 + mono
        server = None if true is None else sent + up + true
        out.append(est.observe(sent, sent + up + down, server, mono + up + down))
    return out


def test_the_quietest_round_trip_of_the_last_n_wins() -> None:
    est = ClockEstimator(samples=3, max_age=100.0)
    got = feed(
        est,
        [
            (0.0, 0.005, 0.020, 0.001),  # congested: offset off by ~10 ms, u ~10 ms
            (5.0, 0.005, 0.0002, 0.0002),  # quiet: u 0.2 ms
            (10.0, 0.005, 0.010, 0.030),
            (15.0, 0.005, 0.004, 0.001),
        ],
    )
    assert got[0] is not None and got[0].uncertainty_s == near(0.0105)
    for g in got[1:]:
        assert g is not None and g.uncertainty_s == near(0.0002)
        assert g.offset_s == near(0.005)
    # Three newer samples later the quiet one has left the window: the best of the rest.
    (last,) = feed(est, [(20.0, 0.005, 0.003, 0.003)])
    assert last is not None and last.uncertainty_s == near(0.0025)


def test_a_stepped_clock_is_followed_at_once() -> None:
    est = ClockEstimator(samples=8, max_age=100.0)
    before = feed(est, [(0.0, 0.0, 0.0001, 0.0001), (5.0, 0.0, 0.001, 0.001)])
    assert before[-1] == ClockOffset(near(0.0), near(0.0001))  # type: ignore[arg-type]
    # The node's clock steps back by 0.5 s (Fleet now reads 0.5 s ahead); the new sample
    # is noisier than the old best, yet the old best no longer describes the clocks.
    (after,) = feed(est, [(10.0, 0.5, 0.002, 0.002)])
    assert after is not None and after.offset_s == near(0.5)
    # Drift within JUMP_SLACK is not a step: the quieter old sample stays the estimate.
    est2 = ClockEstimator(samples=8, max_age=100.0)
    feed(est2, [(0.0, 0.0, 0.0001, 0.0001)])
    (drifted,) = feed(est2, [(5.0, JUMP_SLACK / 2, 0.002, 0.002)])
    assert drifted is not None and drifted.uncertainty_s == near(0.0001)


def test_an_older_fleet_without_server_time_gives_no_estimate() -> None:
    est = ClockEstimator(samples=4, max_age=30.0)
    assert feed(est, [(0.0, None, 0.001, 0.001)] * 3) == [None, None, None]  # type: ignore[list-item]
    # A Fleet that answered with its time, then a failing one: the estimate holds until stale.
    got = feed(
        est,
        [(10.0, 0.002, 0.001, 0.001), (15.0, None, 0, 0), (35.0, None, 0, 0), (45.0, None, 0, 0)],
    )  # type: ignore[list-item]
    assert [g is not None for g in got] == [True, True, True, False]


# (offsets (s) seen one per interval, uncertainty, expected starts/ends)
SKEWS = [
    ("within the bound", [0.0, 0.009, -0.009], 0.0005, [None, None, None]),
    ("beyond, provably", [0.0, 0.0125, 0.013, 0.002], 0.001, [None, "start", None, "end"]),
    ("beyond, but not provably", [0.012, 0.012], 0.003, [None, None]),
    ("negative offset", [-0.5, -0.5, -0.0095], 0.0001, ["start", None, "end"]),
    (
        "between the edges it holds",
        [0.02, 0.0105, 0.0105, 0.01],
        0.001,
        ["start", None, None, "end"],
    ),
]


@pytest.mark.parametrize(("name", "offsets", "u", "expected"), SKEWS, ids=[s[0] for s in SKEWS])
def test_clock_skew_starts_and_ends_once_with_one_event_id(
    name: str, offsets: list[float], u: float, expected: list[str | None]
) -> None:
    ep = SkewEpisode(0.010)
    changes = [ep.observe(ClockOffset(o, u)) for o in offsets]
    assert [c[0] if c else None for c in changes] == expected
    ids = {c[1] for c in changes if c}
    assert len(ids) == (1 if any(expected) else 0)


def test_no_estimate_holds_an_open_episode_and_the_event_reads_well() -> None:
    ep = SkewEpisode(0.010)
    start = ep.observe(ClockOffset(0.050, 0.001))
    assert start is not None and ep.open
    assert ep.observe(None) is None and ep.open
    event = skew_event(
        "start",
        start[1],
        ClockOffset(0.050, 0.001),
        0.010,
        node_id="n1",
        cluster_id="c",
        timestamp=1.0,
        job_id="7",
        rank=3,
    )
    assert event.type == "clock_skew" and event.event_id == start[1]
    assert (event.extra["state"], event.extra["offset_ms"], event.extra["uncertainty_ms"]) == (
        "start",
        50.0,
        1.0,
    )
    fields = event.journal_fields()
    assert fields["INGERO_OFFSET_MS"] == "50.0" and fields["INGERO_UNCERTAINTY_MS"] == "1.0"
    assert "+50.0 ms" in event.message()
