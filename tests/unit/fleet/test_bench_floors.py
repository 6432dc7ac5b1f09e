"""bench.fleet_push's floor servers: each answers a push as the no-op does, after doing
the part of Fleet's work it stands for (bench.fleet_compare --floors compares them)."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError

from bench.fleet_compare import full_bodies
from bench.fleet_push import FLOORS
from ingero.fleet.httpserver import HttpRequest


def _request(body: bytes) -> HttpRequest:
    return HttpRequest("POST", "/v1/metrics", "", {}, body)


@pytest.mark.parametrize("kind", sorted(FLOORS))
def test_every_floor_answers_a_full_push_as_the_noop_does(kind: str) -> None:
    (body,) = full_bodies(0, 1)
    response = FLOORS[kind]()(_request(body))
    assert (response.status, response.body) == (200, b"")


@pytest.mark.parametrize("kind", ["parse-http", "read-http"])
def test_the_floors_that_parse_read_the_body(kind: str) -> None:
    # A length-delimited field running past the end: upb refuses it, so a floor that
    # answered this without error would not be parsing what it is sent.
    with pytest.raises(DecodeError):
        FLOORS[kind]()(_request(b"\x0a\xff\x01"))


def test_the_noop_reads_nothing() -> None:
    assert FLOORS["noop-http"]()(_request(b"\x0a\xff\x01")).status == 200


def test_the_read_floor_decodes_as_fleet_does() -> None:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )

    import ingero.otlp.health as health

    (body,) = full_bodies(7, 1)
    resource = ExportMetricsServiceRequest.FromString(body).resource_metrics[0].resource
    key = resource.SerializeToString()
    health._resources.pop(key, None)
    FLOORS["parse-http"]()(_request(body))
    assert key not in health._resources
    # decode_health keeps a valid resource's fields by its bytes: it read this push.
    FLOORS["read-http"]()(_request(body))
    assert key in health._resources
