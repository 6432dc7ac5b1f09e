"""Fleet's own Prometheus metrics, on a private registry served at ``/metrics``."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase

from ingero.fleet.model import GroupStats

_GROUP_LABELS = ("cluster_id", "group")
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)


class FleetMetrics:
    """Counters for the receivers (hot path: cached label children) and per-group gauges."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "ingero_fleet_requests",
            "Push requests answered, by transport (http|grpc), signal (metrics|logs) and code.",
            ("transport", "signal", "code"),
            registry=r,
        )
        self.rejected = Counter(
            "ingero_fleet_rejected",
            "Requests or data points refused, by reason.",
            ("reason",),
            registry=r,
        )
        self.request_seconds = Histogram(
            "ingero_fleet_request_seconds",
            "Time to decode, ingest and answer one push.",
            ("transport", "signal"),
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tracked_nodes = Gauge(
            "ingero_fleet_tracked_nodes", "Nodes Fleet holds a score for.", registry=r
        )
        self.groups = Gauge("ingero_fleet_groups", "Peer groups Fleet tracks.", registry=r)
        self.tick_seconds = Histogram(
            "ingero_fleet_tick_seconds",
            "Duration of one threshold tick (state tick + publishing).",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=r,
        )
        self.ticks_failed = Counter(
            "ingero_fleet_tick_failures", "Ticks that raised (the loop goes on).", registry=r
        )
        self.listener_errors = Counter(
            "ingero_fleet_tick_listener_errors",
            "Exceptions raised by tick listeners or event sinks (logged, never fatal).",
            ("listener",),
            registry=r,
        )
        self.events = Counter(
            "ingero_fleet_events",
            "Events published, by type and source.",
            ("type", "source"),
            registry=r,
        )
        self.events_dropped = Counter(
            "ingero_fleet_events_dropped",
            "Events dropped because the publish queue was full.",
            registry=r,
        )
        self.group_gauges: dict[str, Gauge] = {
            name: Gauge(f"ingero_fleet_{name}", help_text, _GROUP_LABELS, registry=r)
            for name, help_text in (
                ("threshold", "Smoothed straggler threshold of the group (raw without quorum)."),
                ("median", "Median health score of the group's active nodes."),
                ("mad", "Median absolute deviation of the group's active scores."),
                ("active_nodes", "Active nodes in the group."),
                ("idle_nodes", "Idle nodes in the group (not in the statistics)."),
                ("coverage_low", "1 when the cluster reports fewer nodes than expected."),
                ("panic_mode", "1 when the group is degraded as a whole."),
                ("straggler_count", "Nodes of the group in the straggler state."),
                ("quorum_met", "1 when the group has enough active nodes for a threshold."),
            )
        }
        self._children: dict[tuple[str, ...], MetricWrapperBase] = {}
        self._group_labels: set[tuple[str, str]] = set()

    def count_request(self, transport: str, signal: str, code: str, seconds: float) -> None:
        key = (transport, signal, code)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.requests.labels(*key)
        child.inc()  # type: ignore[attr-defined]
        hkey = (transport, signal, "seconds")
        hist = self._children.get(hkey)
        if hist is None:
            hist = self._children[hkey] = self.request_seconds.labels(transport, signal)
        hist.observe(seconds)  # type: ignore[attr-defined]

    def count_rejected(self, reasons: dict[str, int]) -> None:
        for reason, n in reasons.items():
            self.rejected.labels(reason).inc(n)

    def update_groups(self, groups: Iterable[GroupStats]) -> None:
        """Set every group's gauges; label sets of groups that vanished are removed."""
        seen: set[tuple[str, str]] = set()
        for g in groups:
            labels = (g.cluster_id, g.group)
            seen.add(labels)
            values = {
                "threshold": g.threshold,
                "median": g.median,
                "mad": g.mad,
                "active_nodes": g.active_nodes,
                "idle_nodes": g.idle_nodes,
                "coverage_low": int(g.coverage_low),
                "panic_mode": int(g.panic),
                "straggler_count": g.straggler_count,
                "quorum_met": int(g.quorum_met),
            }
            for name, value in values.items():
                gauge = self.group_gauges[name].labels(*labels)
                gauge.set(float("nan") if value is None else float(value))
        for labels in self._group_labels - seen:
            for gauge in self.group_gauges.values():
                gauge.remove(*labels)
        self._group_labels = seen
        self.groups.set(len(seen))

    def render(self) -> bytes:
        return generate_latest(self.registry)
