"""The threshold reply codec (ingero.otlp.threshold): push-reply headers, gRPC metadata and
the API's JSON, each decoded back to what was encoded; insane values refused."""

from __future__ import annotations

import dataclasses
import json

import pytest

from ingero.otlp.threshold import (
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
