"""fleet-push's own failover between several Fleet endpoints (no balancer in front): the
endpoint list from config and flags, and the sticky Failover of the exporter core."""

from __future__ import annotations

import random

import pytest

from ingero.otlp.exporter import Backoff, ExportError, Failover, fails_over_grpc, fails_over_http
from ingero.push.config import PushConfig
from ingero.runtime.config import ConfigError, build


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("http://a:4318", ["http://a:4318"]),
        ("http://a:4318,http://b:4318", ["http://a:4318", "http://b:4318"]),
        (" http://a:4318 , http://b:4318 ,", ["http://a:4318", "http://b:4318"]),
        (["http://a:4318", "http://b:4318"], ["http://a:4318", "http://b:4318"]),
        (
            ["http://a:4318,http://b:4318", "http://c:4318"],
            ["http://a:4318", "http://b:4318", "http://c:4318"],
        ),
    ],
)
def test_endpoints_from_config(value: object, expected: list[str]) -> None:
    config = build(PushConfig, {"fleet_endpoint": value}, "test.yaml")
    assert config.fleet_endpoints == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], "no endpoint"),
        ("", "no endpoint"),
        (["http://a:4318", "b:4318"], "'b:4318'"),
        (["http://a:4318", 7], "expected a string"),
        ({"a": 1}, "expected a list"),
    ],
)
def test_bad_endpoints_are_one_line(value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build(PushConfig, {"fleet_endpoint": value}, "test.yaml")


@pytest.mark.parametrize(
    ("status", "fails_over"), [(200, False), (400, False), (429, False), (500, True), (503, True)]
)
def test_http_failover_statuses(status: int, fails_over: bool) -> None:
    assert fails_over_http(status) is fails_over


@pytest.mark.parametrize(
    ("code", "fails_over"),
    [
        ("UNAVAILABLE", True),
        ("DEADLINE_EXCEEDED", True),
        ("UNAUTHENTICATED", False),
        ("RESOURCE_EXHAUSTED", False),
        ("INVALID_ARGUMENT", False),
    ],
)
def test_grpc_failover_codes(code: str, fails_over: bool) -> None:
    assert fails_over_grpc(code) is fails_over


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def failover(n: int, clock: Clock) -> Failover[str]:
    rng = random.Random(0)
    return Failover([f"r{i}" for i in range(n)], lambda: Backoff(5.0, 60.0, rng), clock)


def answering(down: set[str], tried: list[str]) -> object:
    def attempt(target: str) -> str:
        tried.append(target)
        if target in down:
            raise ExportError(f"cannot reach {target}", retryable=True, failover=True)
        return target

    return attempt


def test_sticky_on_the_one_that_works_and_next_on_failure() -> None:
    clock = Clock()
    f = failover(3, clock)
    tried: list[str] = []
    assert f.call(answering(set(), tried)) == "r0"
    assert f.call(answering({"r0"}, tried)) == "r1"  # within the same call
    assert tried == ["r0", "r0", "r1"]
    tried.clear()
    clock.t += 1000  # r0 is back and its back-off long over: still r1 (sticky)
    assert f.call(answering(set(), tried)) == "r1"
    assert tried == ["r1"]


def test_a_failed_receiver_waits_out_its_backoff() -> None:
    clock = Clock()
    f = failover(2, clock)
    tried: list[str] = []
    assert f.call(answering({"r0"}, tried)) == "r1"
    tried.clear()
    # r1 fails too while r0 is still in back-off: r0 is not tried within this call.
    with pytest.raises(ExportError, match="r1"):
        f.call(answering({"r0", "r1"}, tried))
    assert tried == ["r1"]
    tried.clear()
    clock.t += 61  # both waits over: one attempt each, in list order from the current one
    with pytest.raises(ExportError):
        f.call(answering({"r0", "r1"}, tried))
    assert sorted(tried) == ["r0", "r1"] and len(tried) == 2


def test_all_down_then_one_back() -> None:
    clock = Clock()
    f = failover(3, clock)
    tried: list[str] = []
    with pytest.raises(ExportError):
        f.call(answering({"r0", "r1", "r2"}, tried))
    assert tried == ["r0", "r1", "r2"]  # at most one attempt per receiver per call
    clock.t += 61
    assert f.call(answering({"r0", "r1"}, [])) == "r2"
    assert f.current == 2


def test_retry_after_lengthens_the_wait() -> None:
    clock = Clock()
    f = failover(2, clock)

    def busy(target: str) -> str:
        if target == "r0":
            raise ExportError("503", retryable=True, retry_after=30.0, failover=True)
        return target

    assert f.call(busy) == "r1"
    f.current = 1
    clock.t += 20  # r0 asked for 30 s: not tried yet when r1 fails
    tried: list[str] = []
    with pytest.raises(ExportError):
        f.call(answering({"r0", "r1"}, tried))
    assert tried == ["r1"]


def test_a_refusal_does_not_fail_over() -> None:
    f = failover(2, Clock())
    tried: list[str] = []

    def refuse(target: str) -> str:
        tried.append(target)
        raise ExportError("401", retryable=False)

    with pytest.raises(ExportError, match="401"):
        f.call(refuse)
    assert tried == ["r0"] and f.current == 0
