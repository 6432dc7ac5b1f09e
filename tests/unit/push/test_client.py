"""Push client rules: Retry-After, jitter, API address (the threshold codec: test_otlp_threshold)."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from ingero.otlp.exporter import jittered, parse_retry_after
from ingero.push.client import api_base
from ingero.push.config import PushConfig

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
    cfg = PushConfig(fleet_endpoint=endpoint, api_endpoint=api)
    assert api_base(cfg, cfg.fleet_endpoints[0]) == expected


def test_grpc_target_gets_http_api() -> None:
    cfg = PushConfig(fleet_endpoint="fleet:4317", transport="grpc")
    assert api_base(cfg, "fleet:4317") == "http://fleet:8080"
