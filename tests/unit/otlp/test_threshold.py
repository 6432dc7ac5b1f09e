"""The threshold reply codec (ingero.otlp.threshold): push-reply headers, gRPC metadata and
the API's JSON, each decoded back to what was encoded; insane values refused."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingero.otlp.threshold import (
    HEADERS,
    NCCL_EPISODE_TYPES,
    ThresholdView,
    decode_headers,
    decode_json,
    decode_metadata,
    encode_headers,
    encode_json,
    encode_metadata,
)

# (case, the view Fleet serves, what its push-reply headers say)
VIEWS = [
    (
        "quorum",
        ThresholdView(
            cluster_id="c",
            group="c/job/1",
            threshold=0.8123456789,
            median=0.9,
            mad=0.01,
            quorum_met=True,
            panic=False,
            active_nodes=5,
            computed_at=1_700_000_000.25,
        ),
        [
            ("X-Ingero-Threshold", "0.8123456789"),
            ("X-Ingero-Quorum-Met", "true"),
            ("X-Ingero-Panic", "false"),
        ],
    ),
    (
        "no quorum: null threshold",
        ThresholdView(
            cluster_id="c",
            group="c/workload/training",
            threshold=None,
            median=0.91,
            mad=0.0,
            quorum_met=False,
            panic=False,
            active_nodes=3,
            computed_at=12.5,
        ),
        [("X-Ingero-Threshold", ""), ("X-Ingero-Quorum-Met", "false"), ("X-Ingero-Panic", "false")],
    ),
    (
        "panic",
        ThresholdView(
            cluster_id="c",
            group="c/job/7",
            threshold=0.7,
            median=0.75,
            mad=0.2,
            quorum_met=True,
            panic=True,
            active_nodes=40,
            computed_at=3.0,
        ),
        [
            ("X-Ingero-Threshold", "0.7"),
            ("X-Ingero-Quorum-Met", "true"),
            ("X-Ingero-Panic", "true"),
        ],
    ),
    (
        "no active node, bounds of the range",
        ThresholdView(cluster_id="c", group="c/job/2", threshold=0.0, active_nodes=0),
        [
            ("X-Ingero-Threshold", "0.0"),
            ("X-Ingero-Quorum-Met", "false"),
            ("X-Ingero-Panic", "false"),
        ],
    ),
    (
        "threshold 1",
        ThresholdView(cluster_id="c", group="g", threshold=1.0, quorum_met=True),
        [
            ("X-Ingero-Threshold", "1.0"),
            ("X-Ingero-Quorum-Met", "true"),
            ("X-Ingero-Panic", "false"),
        ],
    ),
    (
        "peer rates, the node's ratios and its open episode",
        ThresholdView(
            cluster_id="c",
            group="c/job/9",
            threshold=0.85,
            quorum_met=True,
            peer_rates={"kernel_launch_rate": 3484.25, "step_rate": 10.0},
            rate_ratios={"kernel_launch_rate": 0.75, "step_rate": 0.0},
            episode_id="3f2c9e4a-0d7b-4f4e-9b7e-1c2d3e4f5a6b",
        ),
        [
            ("X-Ingero-Threshold", "0.85"),
            ("X-Ingero-Quorum-Met", "true"),
            ("X-Ingero-Panic", "false"),
            ("X-Ingero-Peer-Rates", "kernel_launch_rate=3484.25,step_rate=10.0"),
            ("X-Ingero-Rate-Ratios", "kernel_launch_rate=0.75,step_rate=0.0"),
            ("X-Ingero-Episode-Id", "3f2c9e4a-0d7b-4f4e-9b7e-1c2d3e4f5a6b"),
        ],
    ),
    (
        "a collective_hang that waits for a rank of the node",
        ThresholdView(
            cluster_id="c",
            group="c/job/9",
            threshold=0.85,
            quorum_met=True,
            nccl_episode_id="9d1c2b3a-0d7b-4f4e-9b7e-1c2d3e4f5a6b",
            nccl_episode_type="collective_hang",
            nccl_episode_since=1700000000.25,
            nccl_episode_op="ncclAllReduce",
            nccl_episode_seq=9001,
        ),
        [
            ("X-Ingero-Threshold", "0.85"),
            ("X-Ingero-Quorum-Met", "true"),
            ("X-Ingero-Panic", "false"),
            ("X-Ingero-Nccl-Episode-Id", "9d1c2b3a-0d7b-4f4e-9b7e-1c2d3e4f5a6b"),
            ("X-Ingero-Nccl-Episode-Type", "collective_hang"),
            ("X-Ingero-Nccl-Episode-Since", "1700000000.25"),
            ("X-Ingero-Nccl-Episode-Op", "ncclAllReduce"),
            ("X-Ingero-Nccl-Episode-Seq", "9001"),
        ],
    ),
    (
        "a rank of the node waits in a collective for two ranks",
        ThresholdView(
            cluster_id="c",
            group="c/job/9",
            threshold=0.85,
            quorum_met=True,
            waiting_for={
                "event_id": "5e1c2b3a-0d7b-4f4e-9b7e-1c2d3e4f5a6b",
                "comm_hash": "9f1c2e3d4a5b6c7d",
                "op": "ncclAllReduce",
                "seq": 8813,
                "since": 1700000000.5,
                "ranks": [3, 5],
                "nodes": ["gpu-03", "rack 2,gpu05"],
            },
        ),
        [
            ("X-Ingero-Threshold", "0.85"),
            ("X-Ingero-Quorum-Met", "true"),
            ("X-Ingero-Panic", "false"),
            (
                "X-Ingero-Waiting-For",
                "event_id=5e1c2b3a-0d7b-4f4e-9b7e-1c2d3e4f5a6b,comm_hash=9f1c2e3d4a5b6c7d,"
                "op=ncclAllReduce,seq=8813,since=1700000000.5,ranks=3 5,"
                "nodes=gpu-03 rack%202%2Cgpu05",
            ),
        ],
    ),
    (
        "every rank of the communicator stopped at one collective",
        ThresholdView(
            cluster_id="c",
            group="c/job/9",
            waiting_for={
                "event_id": "5e1c2b3a-0d7b-4f4e-9b7e-1c2d3e4f5a6b",
                "comm_hash": "9f1c2e3d4a5b6c7d",
                "op": "ncclAllReduce",
                "seq": 8813,
                "since": 12.0,
                "ranks": [],
                "nodes": [],
            },
        ),
        [
            ("X-Ingero-Threshold", ""),
            ("X-Ingero-Quorum-Met", "false"),
            ("X-Ingero-Panic", "false"),
            (
                "X-Ingero-Waiting-For",
                "event_id=5e1c2b3a-0d7b-4f4e-9b7e-1c2d3e4f5a6b,comm_hash=9f1c2e3d4a5b6c7d,"
                "op=ncclAllReduce,seq=8813,since=12.0,ranks=,nodes=",
            ),
        ],
    ),
]
IDS = [case for case, _, _ in VIEWS]


def push_part(view: ThresholdView) -> ThresholdView:
    """What a push reply carries of a view: threshold, quorum, panic, and where Fleet has
    them the peer rates, the node's ratios and its open episode."""
    return ThresholdView(
        threshold=view.threshold,
        quorum_met=view.quorum_met,
        panic=view.panic,
        peer_rates=view.peer_rates,
        rate_ratios=view.rate_ratios,
        episode_id=view.episode_id,
        nccl_episode_id=view.nccl_episode_id,
        nccl_episode_type=view.nccl_episode_type,
        nccl_episode_since=view.nccl_episode_since,
        nccl_episode_op=view.nccl_episode_op,
        nccl_episode_seq=view.nccl_episode_seq,
        waiting_for=view.waiting_for,
    )


@pytest.mark.parametrize(("case", "view", "headers"), VIEWS, ids=IDS)
def test_json_round_trip_keeps_every_field(
    case: str, view: ThresholdView, headers: list[tuple[str, str]]
) -> None:
    text = json.dumps(encode_json(view))  # through JSON text, as the API sends it
    assert decode_json(json.loads(text)) == view


@pytest.mark.parametrize(("case", "view", "headers"), VIEWS, ids=IDS)
def test_headers_round_trip(case: str, view: ThresholdView, headers: list[tuple[str, str]]) -> None:
    assert encode_headers(view) == headers
    assert decode_headers(dict(headers)) == push_part(view)


@pytest.mark.parametrize(("case", "view", "headers"), VIEWS, ids=IDS)
def test_metadata_round_trip(
    case: str, view: ThresholdView, headers: list[tuple[str, str]]
) -> None:
    metadata = encode_metadata(view)
    # gRPC metadata keys are the header names, lower-case and without the X- prefix
    assert [key for key, _ in metadata] == [name.lower()[2:] for name, _ in headers]
    assert [value for _, value in metadata] == [value for _, value in headers]
    assert decode_metadata(metadata) == push_part(view)


def test_the_api_json_has_the_documented_keys_in_order() -> None:
    assert list(encode_json(VIEWS[0][1])) == [
        "cluster_id",
        "group",
        "threshold",
        "median",
        "mad",
        "quorum_met",
        "panic",
        "active_nodes",
        "computed_at",
        "peer_rates",
        "rate_ratios",
        "episode_id",
        "server_time",
        "peer_lag",
        "nccl_episode_id",
        "nccl_episode_type",
        "nccl_episode_since",
        "nccl_episode_op",
        "nccl_episode_seq",
        "waiting_for",
    ]
    assert encode_json(VIEWS[1][1])["threshold"] is None
    assert encode_json(VIEWS[1][1])["peer_rates"] is None


def test_added_fields_are_left_out_of_a_reply_while_they_have_no_value() -> None:
    # An older node reads exactly the three headers it knows; a newer one reads none.
    view = ThresholdView(threshold=0.5, quorum_met=True, peer_rates={}, rate_ratios=None)
    assert [name for name, _ in encode_headers(view)] == [
        "X-Ingero-Threshold",
        "X-Ingero-Quorum-Met",
        "X-Ingero-Panic",
    ]
    assert decode_headers(dict(encode_headers(view))) == ThresholdView(
        threshold=0.5, quorum_met=True
    )


def test_nothing_accepted_means_nothing_sent_and_nothing_read() -> None:
    assert encode_headers(None) == []
    assert encode_metadata(None) == ()
    assert decode_metadata([("content-type", "application/grpc")]) is None


def test_metadata_ignores_binary_values_and_a_later_value_wins() -> None:
    metadata = [
        ("ingero-threshold", "0.5"),
        ("ingero-quorum-met", "true"),
        ("ingero-panic", b"true"),  # a -bin style value is not ours
        ("ingero-threshold", "0.6"),  # trailing metadata after initial
    ]
    assert decode_metadata(metadata) == ThresholdView(threshold=0.6, quorum_met=True)


def test_keyword_only_so_added_fields_shift_nothing() -> None:
    with pytest.raises(TypeError):
        ThresholdView(0.5, True, False)  # type: ignore[misc]
    assert all(f.kw_only for f in dataclasses.fields(ThresholdView))


def test_unknown_api_keys_are_ignored() -> None:
    body = {**encode_json(VIEWS[0][1]), "added_later": {"x": 1}}
    assert decode_json(body) == VIEWS[0][1]


def test_headers_absent_is_none_and_names_are_case_insensitive() -> None:
    assert decode_headers({"Content-Type": "x"}) is None
    got = decode_headers(
        {"x-ingero-threshold": "0.75", "X-INGERO-QUORUM-MET": "true", "X-Ingero-Panic": "False"}
    )
    assert got == ThresholdView(threshold=0.75, quorum_met=True, panic=False)


def test_quorum_without_threshold() -> None:
    assert decode_headers({"X-Ingero-Quorum-Met": "false"}) == ThresholdView(
        threshold=None, quorum_met=False, panic=False
    )


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Ingero-Threshold": "nan", "X-Ingero-Quorum-Met": "true"},
        {"X-Ingero-Threshold": "inf", "X-Ingero-Quorum-Met": "true"},
        {"X-Ingero-Threshold": "-0.1", "X-Ingero-Quorum-Met": "true"},
        {"X-Ingero-Threshold": "1.01", "X-Ingero-Quorum-Met": "true"},
        {"X-Ingero-Threshold": "abc", "X-Ingero-Quorum-Met": "true"},
        {"X-Ingero-Threshold": "0.5", "X-Ingero-Quorum-Met": "yes"},
        {"X-Ingero-Threshold": "0.5", "X-Ingero-Panic": "1"},
        {"X-Ingero-Peer-Rates": "kernel_launch_rate"},
        {"X-Ingero-Peer-Rates": "kernel_launch_rate=-1"},
        {"X-Ingero-Peer-Rates": "kernel_launch_rate=nan"},
        {"X-Ingero-Rate-Ratios": "step_rate=fast"},
        {"X-Ingero-Rate-Ratios": ",".join(f"r{i}=1" for i in range(17))},
    ],
)
def test_insane_headers_rejected(headers: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        decode_headers(headers)
    with pytest.raises(ValueError):
        decode_metadata([(name.lower()[2:], value) for name, value in headers.items()])


def test_api_answer() -> None:
    body = {"threshold": 0.6, "quorum_met": True, "panic": True, "median": 0.9}
    # the decoder returns every field the answer holds (the median too)
    assert decode_json(body) == ThresholdView(
        threshold=0.6, quorum_met=True, panic=True, median=0.9
    )
    assert decode_json({"threshold": None, "quorum_met": False}) == ThresholdView(
        threshold=None, quorum_met=False, panic=False
    )


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"threshold": "0.5"},
        {"threshold": 2},
        {"threshold": True},
        {"threshold": 0.5, "quorum_met": "true"},
        {"threshold": -1},
        {"threshold": 0.5, "median": "high"},
        {"threshold": 0.5, "active_nodes": -1},
        {"threshold": 0.5, "active_nodes": 2.5},
        {"threshold": 0.5, "cluster_id": 7},
        {"threshold": 0.5, "computed_at": float("nan")},
    ],
)
def test_insane_api_answers_rejected(body: object) -> None:
    with pytest.raises(ValueError):
        decode_json(body)


# ---- the reply's text fields: bounded, from their alphabet; a bad episode is ignored ------

HOSTILE = "9" * 60_000
EPISODE = {
    "X-Ingero-Nccl-Episode-Id": "9d1c2b3a-0d7b-4f4e-9b7e-1c2d3e4f5a6b",
    "X-Ingero-Nccl-Episode-Type": "collective_hang",
    "X-Ingero-Nccl-Episode-Since": "1700000000.25",
    "X-Ingero-Nccl-Episode-Op": "ncclAllReduce",
    "X-Ingero-Nccl-Episode-Seq": "9001",
}
BASE = {"X-Ingero-Threshold": "0.8", "X-Ingero-Quorum-Met": "true"}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("X-Ingero-Nccl-Episode-Id", HOSTILE),  # too long
        ("X-Ingero-Nccl-Episode-Id", "9d1c2b3a/../../etc"),  # not the UUID alphabet
        ("X-Ingero-Nccl-Episode-Type", "new_kind"),  # not a type this node knows
        ("X-Ingero-Nccl-Episode-Type", HOSTILE),
        ("X-Ingero-Nccl-Episode-Op", "ncclAllReduce<script>"),
        ("X-Ingero-Nccl-Episode-Op", "x" * 65),
        ("X-Ingero-Nccl-Episode-Since", "soon"),
        ("X-Ingero-Nccl-Episode-Seq", "-3"),
    ],
)
def test_a_bad_field_of_the_nccl_episode_ignores_the_episode_not_the_reply(
    name: str, value: str
) -> None:
    """A spoofed reply with a 60,000-character episode id, type and op made fleet-push take
    a snapshot under that id, log 110 KB lines and send 161 KB events Fleet then refused."""
    for decode in (
        lambda h, r: decode_headers(h, r),
        lambda h, r: decode_metadata([(k.lower()[2:], v) for k, v in h.items()], r),
    ):
        rejected: list[str] = []
        got = decode({**BASE, **EPISODE, name: value}, rejected)
        assert got == ThresholdView(threshold=0.8, quorum_met=True)  # no part of the episode
        assert len(rejected) == 1 and rejected[0].startswith("nccl_episode ignored: ")
        assert len(rejected[0]) < 200  # the value is quoted bounded, never whole


@pytest.mark.parametrize(
    "value",
    [
        "comm_hash=9f1c2e3d4a5b6c7d,op=x,seq=1,since=1",  # no id
        "event_id=e,comm_hash=h,op=x,seq=-1,since=1",
        "event_id=e,comm_hash=h,op=x,seq=1,since=nan",
        "event_id=e,comm_hash=h,op=x,seq=1,since=1,ranks=a",
        "event_id=e,comm_hash=h,op=x,seq=1",
        "event_id",
        "event_id=e,comm_hash=h,op=x,seq=1,since=1,ranks=" + " ".join(map(str, range(65))),
        f"event_id={HOSTILE},comm_hash=h,op=x,seq=1,since=1",
    ],
)
def test_a_bad_waiting_for_is_ignored_not_the_reply(value: str) -> None:
    for decode in (
        lambda h, r: decode_headers(h, r),
        lambda h, r: decode_metadata([(k.lower()[2:], v) for k, v in h.items()], r),
    ):
        rejected: list[str] = []
        got = decode({**BASE, "X-Ingero-Waiting-For": value}, rejected)
        assert got == ThresholdView(threshold=0.8, quorum_met=True)
        assert len(rejected) == 1 and rejected[0].startswith("waiting_for ignored: ")
        assert len(rejected[0]) < 200


@pytest.mark.parametrize(
    "waiting_for",
    [
        "rank 3",
        {"event_id": "e", "comm_hash": "h", "op": "x", "seq": 1},  # no since
        {"event_id": "e", "comm_hash": "h", "op": "x", "seq": 1, "since": 1, "nodes": [7]},
    ],
)
def test_a_bad_waiting_for_in_an_api_answer_is_left_out(waiting_for: object) -> None:
    got = decode_json({"threshold": 0.8, "quorum_met": True, "waiting_for": waiting_for})
    assert got == ThresholdView(threshold=0.8, quorum_met=True)


def test_a_bad_episode_id_is_ignored_and_a_bad_threshold_still_refuses_the_reply() -> None:
    rejected: list[str] = []
    got = decode_headers({**BASE, "X-Ingero-Episode-Id": HOSTILE}, rejected)
    assert got == ThresholdView(threshold=0.8, quorum_met=True) and len(rejected) == 1
    with pytest.raises(ValueError) as refused:
        decode_headers({"X-Ingero-Threshold": HOSTILE, "X-Ingero-Quorum-Met": "true"})
    assert len(str(refused.value)) < 200


def test_fleet_never_writes_a_part_s_field_its_decoder_would_refuse() -> None:
    # an op as some node reported it: the reply leaves it out, the episode stands
    view = ThresholdView(threshold=0.8, quorum_met=True, nccl_episode_id=EPISODE[
        "X-Ingero-Nccl-Episode-Id"], nccl_episode_type="peer_lag", nccl_episode_since=5.0,
        nccl_episode_op="all reduce <b>")  # fmt: skip
    headers = dict(encode_headers(view))
    assert "X-Ingero-Nccl-Episode-Op" not in headers
    rejected: list[str] = []
    assert decode_headers(headers, rejected) == replace(push_part(view), nccl_episode_op=None)
    assert rejected == []
    assert encode_json(view)["nccl_episode_op"] is None
    assert decode_json(json.loads(json.dumps(encode_json(view)))) == replace(
        view, nccl_episode_op=None
    )


WORDS = ["0.5", "true", "false", "1e9", "nan", "-1", "peer_lag", "collective_hang",
         "9d1c2b3a-0d7b", HOSTILE, "a=1,b=2", "ncclAllReduce", ""]  # fmt: skip
header_values = st.one_of(st.text(max_size=80), st.sampled_from(WORDS))
header_names = st.sampled_from(HEADERS).flatmap(
    lambda h: st.sampled_from([h, h.lower(), h.upper()])
)


@settings(deadline=None, max_examples=300)
@given(st.dictionaries(header_names | st.text(max_size=20), header_values, max_size=12))
def test_any_reply_decodes_to_what_its_encoder_writes_or_one_bounded_refusal(
    headers: dict[str, str],
) -> None:
    for decode, encode in (
        (lambda h, r: decode_headers(h, r), lambda v: dict(encode_headers(v))),
        (
            lambda h, r: decode_metadata(
                [(k.lower().removeprefix("x-"), v) for k, v in h.items()], r
            ),
            lambda v: {f"x-{k}": val for k, val in encode_metadata(v)},
        ),
    ):
        rejected: list[str] = []
        try:
            view = decode(headers, rejected)
        except ValueError as exc:
            assert len(str(exc)) < 400 and "\n" not in str(exc)
            continue
        assert all(len(r) < 400 for r in rejected)
        if view is None:
            continue
        for text in (view.episode_id, view.nccl_episode_id, view.nccl_episode_op):
            assert text is None or 0 < len(text) <= 64
        assert view.nccl_episode_type in (None, *NCCL_EPISODE_TYPES)
        again: list[str] = []
        assert decode(encode(view), again) == view and again == []


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=70),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids),
    max_leaves=6,
)


@settings(deadline=None, max_examples=200)
@given(st.dictionaries(st.sampled_from([f.name for f in dataclasses.fields(ThresholdView)]),
                       json_values))  # fmt: skip
def test_any_api_answer_decodes_to_what_its_encoder_writes_or_a_refusal(
    body: dict[str, Any],
) -> None:
    try:
        view = decode_json(body, [])
    except ValueError:
        return
    assert decode_json(json.loads(json.dumps(encode_json(view)))) == view
