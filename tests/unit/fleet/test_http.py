"""Pure pieces of Fleet's receivers: HTTP head parsing, body limits, auth, gauges."""

from __future__ import annotations

import gzip
import math

import pytest

from ingero.fleet.httpserver import BadHead, HttpResponse, _parse_head, render
from ingero.fleet.metrics import FleetMetrics
from ingero.fleet.model import GroupStats
from ingero.otlp.receiver import RequestError, inflate, media_type
from ingero.otlp.threshold import ThresholdView
from ingero.otlp.threshold import encode_headers as threshold_headers
from ingero.security.bearer import Keyring, NamedToken, digest


def test_parse_head_keep_alive_rules() -> None:
    req, length, keep = _parse_head(
        b"POST /v1/metrics?x=1 HTTP/1.1\r\nContent-Length: 12\r\nX-A:  b \r\nx-a: c"
    )
    assert (req.method, req.path, req.query, length, keep) == (
        "POST",
        "/v1/metrics",
        "x=1",
        12,
        True,
    )
    assert req.headers["x-a"] == "c"
    assert _parse_head(b"GET / HTTP/1.1\r\nConnection: close")[2] is False
    assert _parse_head(b"GET / HTTP/1.0")[2] is False
    assert _parse_head(b"GET / HTTP/1.0\r\nConnection: keep-alive")[2] is True


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GARBAGE", 400),
        (b"GET / HTTP/2.0", 505),
        (b"GET / HTTP/1.1\r\nno colon here", 400),
        (b"GET / HTTP/1.1\r\n folded: header", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: -1", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: 1e3", 400),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked", 411),
    ],
)
def test_parse_head_rejects(raw: bytes, status: int) -> None:
    with pytest.raises(BadHead) as info:
        _parse_head(raw)
    assert info.value.status == status


def test_render() -> None:
    wire = render(HttpResponse(413, b"big\n", headers=[("X-A", "1")]), keep_alive=False)
    head, body = wire.split(b"\r\n\r\n")
    assert head.split(b"\r\n") == [
        b"HTTP/1.1 413 Request Entity Too Large",
        b"Content-Length: 4",
        b"Content-Type: text/plain; charset=utf-8",
        b"X-A: 1",
        b"Connection: close",
    ]
    assert body == b"big\n"


def test_media_type() -> None:
    assert media_type("application/x-protobuf") == "application/x-protobuf"
    assert media_type("Application/JSON; charset=utf-8") == "application/json"
    for bad in (None, "", "text/plain", "application/protobuf"):
        with pytest.raises(RequestError) as info:
            media_type(bad)
        assert info.value.status == 415


def test_inflate_bounds_and_errors() -> None:
    assert inflate(b"raw", None, 10) == b"raw"
    assert inflate(gzip.compress(b"x" * 100), "gzip", 100) == b"x" * 100
    with pytest.raises(RequestError) as info:
        inflate(gzip.compress(b"x" * 101), "gzip", 100)
    assert info.value.status == 413
    with pytest.raises(RequestError) as info:
        inflate(gzip.compress(b"x" * 100)[:-12], "gzip", 1000)
    assert (info.value.status, str(info.value)) == (400, "truncated gzip body")
    with pytest.raises(RequestError) as info:
        inflate(b"plain", "gzip", 100)
    assert info.value.status == 400
    with pytest.raises(RequestError) as info:
        inflate(b"x", "deflate", 100)
    assert info.value.status == 415


def test_bearer_auth() -> None:
    assert not Keyring([]).enabled
    auth = Keyring([NamedToken("t", digest("tok"), None)])

    def allows(value: str | None) -> bool:
        return auth.check(value).identity is not None

    assert auth.enabled and allows("Bearer tok")
    assert not allows(None)
    assert not allows("Bearer tok2")
    # the scheme name is case-insensitive (RFC 7235); the token is not
    assert allows("bearer tok") and allows("BEARER tok")
    assert not allows("Bearer TOK")
    assert not allows("Basic tok") and not allows("tok") and not allows("")
    assert not allows("Bearer t\u00f6k")


def view(threshold: float | None, quorum: bool, panic: bool) -> ThresholdView:
    return ThresholdView(
        cluster_id="c",
        group="c/job/1",
        threshold=threshold,
        median=0.9,
        mad=0.01,
        quorum_met=quorum,
        panic=panic,
        active_nodes=5,
        computed_at=1.0,
    )


def test_threshold_headers() -> None:
    assert threshold_headers(None) == []
    assert threshold_headers(view(0.8123456789, True, False)) == [
        ("X-Ingero-Threshold", "0.8123456789"),
        ("X-Ingero-Quorum-Met", "true"),
        ("X-Ingero-Panic", "false"),
    ]
    assert threshold_headers(view(None, False, True))[0] == ("X-Ingero-Threshold", "")


def stats(group: str, threshold: float | None) -> GroupStats:
    return GroupStats(
        cluster_id="c",
        group=group,
        job_id=None,
        workload_type="w",
        threshold=threshold,
        raw_threshold=threshold,
        median=0.9,
        mad=0.01,
        quorum_met=True,
        panic=False,
        active_nodes=6,
        idle_nodes=1,
        straggler_count=2,
        coverage_low=False,
        computed_at=1.0,
        noise=0.012,
    )


def test_group_gauges_drop_vanished_groups() -> None:
    metrics = FleetMetrics()
    metrics.update_groups([stats("c/a", 0.8), stats("c/b", None)])
    text = metrics.render().decode()
    assert 'ingero_fleet_threshold{cluster_id="c",group="c/a"} 0.8' in text
    assert 'ingero_fleet_threshold{cluster_id="c",group="c/b"} NaN' in text
    assert 'ingero_fleet_stragglers{cluster_id="c",group="c/a"} 2.0' in text
    metrics.update_groups([stats("c/b", 0.7)])
    text = metrics.render().decode()
    assert 'group="c/a"' not in text
    assert 'ingero_fleet_threshold{cluster_id="c",group="c/b"} 0.7' in text
    assert "ingero_fleet_groups 1.0" in text


def test_request_counters() -> None:
    metrics = FleetMetrics()
    metrics.count_request("http", "metrics", "200", 0.002)
    metrics.count_request("http", "metrics", "200", 0.002)
    metrics.count_rejected({"bad_score": 3})
    text = metrics.render().decode()
    assert 'ingero_fleet_requests_total{code="200",signal="metrics",transport="http"} 2.0' in text
    assert 'ingero_fleet_rejected_total{reason="bad_score"} 3.0' in text
    assert 'ingero_fleet_request_seconds_count{signal="metrics",transport="http"} 2.0' in text


def test_group_gauges_parse_back_with_escaped_labels() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    metrics = FleetMetrics()
    odd = 'c/workload/a "quoted" \\ back\nline'
    metrics.update_groups([stats(odd, 0.75), stats("c/b", None)])
    samples = {
        (s.name, s.labels["group"]): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
        if family.name.startswith("ingero_fleet_") and "group" in s.labels
    }
    assert samples[("ingero_fleet_threshold", odd)] == 0.75
    assert samples[("ingero_fleet_active_nodes", odd)] == 6
    assert math.isnan(samples[("ingero_fleet_threshold", "c/b")])
    assert samples[("ingero_fleet_noise", odd)] == 0.012
    assert len(samples) == 2 * 10
