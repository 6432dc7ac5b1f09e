"""Push client rules: Retry-After, threshold headers and API answers, jitter, API address."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from ingero.push.client import (
    api_base,
    jittered,
    parse_retry_after,
    reading_from_api,
    reading_from_headers,
)
from ingero.push.config import PushConfig
from ingero.push.detection import FleetReading

NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0", 0.0),
        ("7", 7.0),
        (" 120 ", 120.0),
        (None, None),
        ("soon", None),
        ("-3", None),
        ("1.5", None),
        ("Tue, 14 Nov 2023 22:13:20", None),
    ],
)
def test_retry_after_seconds(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value, NOW) == expected


def test_retry_after_http_date() -> None:
    when = format_datetime(datetime.fromtimestamp(NOW + 30, UTC), usegmt=True)
    assert parse_retry_after(when, NOW) == pytest.approx(30.0)
    past = format_datetime(datetime.fromtimestamp(NOW - 30, UTC), usegmt=True)
    assert parse_retry_after(past, NOW) == 0.0


def test_headers_absent_is_none_and_names_are_case_insensitive() -> None:
    assert reading_from_headers({"Content-Type": "x"}) is None
    got = reading_from_headers(
        {"x-ingero-threshold": "0.75", "X-INGERO-QUORUM-MET": "true", "X-Ingero-Panic": "False"}
    )
    assert got == FleetReading(0.75, quorum_met=True, panic=False)


def test_quorum_without_threshold() -> None:
    assert reading_from_headers({"X-Ingero-Quorum-Met": "false"}) == FleetReading(
        None, False, False
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
    ],
)
def test_insane_headers_rejected(headers: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        reading_from_headers(headers)


def test_api_answer() -> None:
    body = {"threshold": 0.6, "quorum_met": True, "panic": True, "median": 0.9}
    assert reading_from_api(body) == FleetReading(0.6, True, True)
    assert reading_from_api({"threshold": None, "quorum_met": False}) == FleetReading(
        None, False, False
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
    ],
)
def test_insane_api_answers_rejected(body: object) -> None:
    with pytest.raises(ValueError):
        reading_from_api(body)


def test_jitter_stays_within_bounds_and_spreads() -> None:
    rng = random.Random(1)
    values = [jittered(5.0, 0.1, rng) for _ in range(2000)]
    assert min(values) >= 4.5 and max(values) <= 5.5
    assert max(values) - min(values) > 0.8  # actually spread, not constant
    assert jittered(5.0, 0.0, rng) == 5.0


@pytest.mark.parametrize(
    ("endpoint", "api", "expected"),
    [
        ("http://fleet:4318", None, "http://fleet:8080"),
        ("https://fleet.example:4318/", None, "https://fleet.example:8080"),
        ("http://[::1]:4318", None, "http://[::1]:8080"),
        ("http://fleet:4318", "http://api:9000/", "http://api:9000"),
    ],
)
def test_api_base(endpoint: str, api: str | None, expected: str) -> None:
    assert api_base(PushConfig(fleet_endpoint=endpoint, api_endpoint=api)) == expected


def test_grpc_target_gets_http_api() -> None:
    cfg = PushConfig(fleet_endpoint="fleet:4317", transport="grpc")
    assert api_base(cfg) == "http://fleet:8080"
