"""Idle GPU time per cluster, partition and user: Fleet's fold of the nodes' ``gpu_idle``
events, served on its /metrics.

Fleet is where it is counted because every node's events reach it (fleet-push sends them as
OTLP logs, and Fleet forwards them to Echo): it sees them all, as they happen, with no
store to query. Echo answers the history (its ``idle_gpus`` question); these are the
gauges an alert or a dashboard reads:

- ``ingero_fleet_idle_gpu_seconds{cluster_id,partition,user}``: GPU-seconds held idle
  (GPUs x seconds: 3600 is one GPU-hour), the episodes that ended in full and the open ones
  up to the scrape, since Fleet started (a gauge: it starts again at 0 with Fleet;
  contrib's recording rule ``ingero:idle_gpu_hours`` divides by 3600). promtool refuses a
  name in hours (not the base unit), so the series is in seconds.
- ``ingero_fleet_idle_gpus{cluster_id,partition,user}``: GPUs in an open episode now.

An ``end`` whose ``start`` Fleet never saw (it started before Fleet did) counts in full from
its own ``since``, ``idle_s`` and ``gpus``; an event delivered twice counts once. An open
episode of a node Fleet expires (it stopped pushing) ends there. Memory is bounded: at most
``max_open`` open episodes (more are dropped and counted) and ``series_limit`` label sets,
the most idle first (``ingero_fleet_idle_gpu_series_omitted`` counts the others); beyond
``4 x series_limit`` label sets a cluster's new ones are summed under ``partition`` and
``user`` ``"*"``.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ingero.fleet.model import NodeKey
from ingero.runtime.clock import Clock
from ingero.schema.events import Event

Key = tuple[str, str, str]  # (cluster_id, partition, user)
OTHER = "*"


@dataclass(frozen=True)
class _Open:
    node: NodeKey
    key: Key
    gpus: int
    since: float


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class IdleGpuLedger:
    def __init__(self, clock: Clock, max_open: int, series_limit: int) -> None:
        self._clock = clock
        self._max_open = max_open
        self._series_limit = series_limit
        self._lock = threading.Lock()
        self._open: dict[str, _Open] = {}
        self._closed: dict[Key, float] = {}  # GPU-seconds of the ended episodes
        self._ended: OrderedDict[str, None] = OrderedDict()  # ids counted, newest last
        self.dropped = 0  # open episodes refused over max_open
        self.malformed = 0  # gpu_idle events without what the gauges need

    def __call__(self, events: Sequence[Event]) -> None:
        """Fleet's event sink (the tick thread)."""
        for event in events:
            if event.type == "gpu_idle":
                with self._lock:
                    self._fold(event)

    def _key(self, event: Event) -> Key:
        part, user = event.extra.get("partition"), event.extra.get("user")
        key = (event.cluster_id, part if isinstance(part, str) else "",
               user if isinstance(user, str) else "")  # fmt: skip
        if key not in self._closed and len(self._closed) >= 4 * self._series_limit:
            key = (event.cluster_id, OTHER, OTHER)
        return key

    def _fold(self, event: Event) -> None:
        extra = event.extra
        gpus, since = extra.get("gpus"), _number(extra.get("since"))
        if (
            not isinstance(gpus, list)
            or since is None
            or extra.get("state") not in ("start", "end")
        ):
            self.malformed += 1
            return
        if event.event_id in self._ended:
            return
        key = self._key(event)
        if extra["state"] == "start":
            if event.event_id not in self._open and len(self._open) >= self._max_open:
                self.dropped += 1
                return
            self._open[event.event_id] = _Open(
                (event.cluster_id, event.node_id), key, len(gpus), since
            )
            self._closed.setdefault(key, 0.0)
            return
        idle_s = _number(extra.get("idle_s"))
        if idle_s is None:
            self.malformed += 1
            return
        opened = self._open.pop(event.event_id, None)
        key = opened.key if opened is not None else key
        self._closed[key] = self._closed.get(key, 0.0) + len(gpus) * max(0.0, idle_s)
        self._ended[event.event_id] = None
        while len(self._ended) > self._max_open:
            self._ended.popitem(last=False)

    def expire(self, nodes: Iterable[NodeKey]) -> None:
        """The nodes Fleet expired: their open episodes end now (a tick listener)."""
        gone = set(nodes)
        if not gone:
            return
        now = self._clock.now()
        with self._lock:
            for event_id in [i for i, o in self._open.items() if o.node in gone]:
                o = self._open.pop(event_id)
                self._closed[o.key] = self._closed.get(o.key, 0.0) + o.gpus * max(
                    0.0, now - o.since
                )
                self._ended[event_id] = None

    def series(self) -> list[tuple[Key, float, int]]:
        """(labels, GPU-seconds, GPUs idle now) per label set, the most idle first."""
        now = self._clock.now()
        with self._lock:
            seconds = dict(self._closed)
            idle: dict[Key, int] = {}
            for o in self._open.values():
                seconds[o.key] = seconds.get(o.key, 0.0) + o.gpus * max(0.0, now - o.since)
                idle[o.key] = idle.get(o.key, 0) + o.gpus
        return sorted(((k, s, idle.get(k, 0)) for k, s in seconds.items()),
                      key=lambda r: (-r[1], r[0]))  # fmt: skip

    def render(self, clusters: frozenset[str] | None = None) -> bytes:
        """The gauges in the text format; ``clusters``: only those (a scoped token, which
        also leaves out the Fleet-wide count of refused events)."""
        rows = [r for r in self.series() if clusters is None or r[0][0] in clusters]
        shown, omitted = rows[: self._series_limit], max(0, len(rows) - self._series_limit)
        labels = [
            f'{{cluster_id="{_label(c)}",partition="{_label(p)}",user="{_label(u)}"}} '
            for (c, p, u), _, _ in shown
        ]
        lines = [
            "# HELP ingero_fleet_idle_gpu_seconds GPU-seconds held idle by Slurm jobs (no process"
            " on the GPU, or 0% busy and no launches), since Fleet started.\n"
            "# TYPE ingero_fleet_idle_gpu_seconds gauge\n",
            *(f"ingero_fleet_idle_gpu_seconds{lab}{s!r}\n" for lab, (_, s, _) in zip(labels, shown, strict=True)),
            "# HELP ingero_fleet_idle_gpus GPUs Slurm jobs hold in an open gpu_idle episode.\n"
            "# TYPE ingero_fleet_idle_gpus gauge\n",
            *(f"ingero_fleet_idle_gpus{lab}{n}\n" for lab, (_, _, n) in zip(labels, shown, strict=True)),
            "# HELP ingero_fleet_idle_gpu_series_omitted Label sets of idle GPU time not shown"
            " (over metrics.idle_gpu_series_limit).\n"
            f"# TYPE ingero_fleet_idle_gpu_series_omitted gauge\ningero_fleet_idle_gpu_series_omitted {omitted}\n",
        ]  # fmt: skip
        if clusters is None:
            lines.append(
                "# HELP ingero_fleet_idle_gpu_events_refused_total gpu_idle events not counted: over"
                " the open episodes' bound (max_open) or without gpus, since or idle_s"
                " (malformed).\n# TYPE ingero_fleet_idle_gpu_events_refused_total counter\n"
                f'ingero_fleet_idle_gpu_events_refused_total{{reason="max_open"}} {self.dropped}\n'
                f'ingero_fleet_idle_gpu_events_refused_total{{reason="malformed"}} {self.malformed}\n'
            )
        return "".join(lines).encode()
