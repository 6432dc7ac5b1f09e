"""The per-slot columns of Fleet's slot store (:class:`ingero.fleet.state.FleetState`).

Their own room: the table of what a slot holds (each column's dtype, width and fill) is a
declaration the store grows, clears and hands out by, read once at import; the store's
logic (ingest, tick, episodes) reads the columns by their attribute names.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ingero.otlp.health import PEER_RATES

# What Echo keeps about a node's hardware, from its last push (host, GPU model/count, provider).
Meta = tuple[str | None, str | None, int | None, str | None]


class Column(NamedTuple):
    """One per-slot column of FleetState: a numpy array (``dtype``, ``width`` values a slot)
    or, with ``dtype`` None, a Python list. A slot holds ``fill`` from the start, when the
    columns grow, when it is handed to a node and when it is freed."""

    attr: str
    dtype: type | None
    fill: object
    width: int = 1

    def make(self, n: int) -> npt.NDArray[Any] | list[object]:
        if self.dtype is None:
            return [self.fill] * n
        return np.full(n if self.width == 1 else (n, self.width), self.fill, dtype=self.dtype)


# Every per-slot column, declared once (their types are FleetState's annotations).
SLOT_COLUMNS = (
    Column("_occupied", np.bool_, False),
    Column("_score", np.float64, 0.0),
    Column("_gid", np.int64, 0),
    Column("_active", np.bool_, False),
    Column("_idle", np.bool_, False),
    Column("_seen", np.float64, 0.0),
    Column("_straggler", np.bool_, False),
    Column("_consec", np.int64, 0),
    Column("_since", np.float64, math.nan),
    Column("_episode_gid", np.int64, -1),
    Column("_rates", np.float64, math.nan, len(PEER_RATES)),
    Column("_stalled", np.bool_, False),
    Column("_stall_episode", np.bool_, False),
    Column("_recent", np.int64, 0),
    Column("_exits", np.int64, 0),
    Column("_last_measured", np.float64, math.nan),
    Column("_noise", np.float64, math.nan),
    Column("_noise_count", np.int64, 0),
    Column("_noise_gid", np.int64, -1),
    Column("_pending", np.bool_, False),
    Column("_pending_at", np.float64, 0.0),
    Column("_fresh", np.bool_, False),
    Column("_says_held", np.bool_, False),
    Column("_reported", None, None),
    Column("_key", None, ("", "")),
    Column("_rank", None, None),
    Column("_signal", None, None),
    Column("_cause", None, None),
    Column("_episode_id", None, ""),
    Column("_meta", None, None),
)
