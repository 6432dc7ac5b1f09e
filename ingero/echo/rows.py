"""What Echo's writer stores, as plain values: an event as the row it is inserted as, and
a health-score sample.

Decoding workers build these and send them to the writer: a tuple pickles in a quarter of
the time of an ``Event``, so rows stay tuples, read by the named positions below.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final

from ingero.schema.events import Event


@dataclass(frozen=True)
class ScorePoint:
    """One health-score sample of one node (from an OTLP metrics push)."""

    cluster_id: str
    node_id: str
    ts: float
    score: float
    job_id: str | None = None
    host_name: str | None = None
    gpu_model: str | None = None
    gpu_count: int | None = None
    provider: str | None = None


# An event as the row it is stored as: the columns of INSERT_EVENT, in order.
EventRow = tuple[
    str,  # event_id
    str,  # type
    str,  # cluster_id
    str,  # node_id
    str | None,  # job_id
    int | None,  # rank
    float | None,  # score
    float | None,  # threshold
    str | None,  # detection_mode
    str | None,  # dominant_signal
    float,  # ts
    float,  # received
    str | None,  # extra, JSON
]
COLUMNS = (
    "event_id",
    "type",
    "cluster_id",
    "node_id",
    "job_id",
    "rank",
    "score",
    "threshold",
    "detection_mode",
    "dominant_signal",
    "ts",
    "received",
    "extra",
)
# The position of each column in an EventRow (Final: mypy types row[TS] as a float).
EVENT_ID: Final = 0
TYPE: Final = 1
CLUSTER_ID: Final = 2
NODE_ID: Final = 3
JOB_ID: Final = 4
RANK: Final = 5
SCORE: Final = 6
THRESHOLD: Final = 7
DETECTION_MODE: Final = 8
DOMINANT_SIGNAL: Final = 9
TS: Final = 10
RECEIVED: Final = 11
EXTRA: Final = 12
INSERT_EVENT = (
    f"INSERT OR IGNORE INTO events ({', '.join(COLUMNS)}) VALUES ({','.join('?' * len(COLUMNS))})"
)


def event_row(ev: Event, received: float) -> EventRow:
    extra = json.dumps(ev.extra, separators=(",", ":"), allow_nan=False) if ev.extra else None
    return (
        ev.event_id,
        ev.type,
        ev.cluster_id,
        ev.node_id,
        ev.job_id,
        ev.rank,
        ev.score,
        ev.threshold,
        ev.detection_mode,
        ev.dominant_signal,
        ev.timestamp,
        received,
        extra,
    )
