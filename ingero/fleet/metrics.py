"""Fleet's own Prometheus metrics, on a private registry served at ``/metrics``."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from ingero.fleet.model import GroupStats
from ingero.runtime.buildinfo import daemon_registry

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)


class NodeRow(Protocol):
    """What the per-node series need of a node (``FleetState.scores_snapshot`` rows)."""

    @property
    def node_id(self) -> str: ...
    @property
    def cluster_id(self) -> str: ...
    @property
    def group(self) -> str: ...
    @property
    def job_id(self) -> str | None: ...
    @property
    def score(self) -> float: ...
    @property
    def state(self) -> str: ...


class _DrainFailures(Collector):
    def __init__(self, read: Callable[[], int]) -> None:
        self.read = read

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            "ingero_fleet_drain_failures",
            "Slurm calls of the drain controller that failed (each is retried with back-off).",
            value=self.read(),
        )


class _SlurmCounts(Collector):
    """Counters of the Slurm parts Fleet runs (the verdict writer, the idle-node resumes),
    read at scrape time from the part that keeps them; none while the part is off."""

    def __init__(self) -> None:
        self.verdicts: Callable[[], Mapping[str, int]] | None = None
        self.verdict_failures: Callable[[], int] | None = None
        self.resumes: Callable[[], Mapping[tuple[str, str], int]] | None = None

    def collect(self) -> Iterator[CounterMetricFamily]:
        if self.verdicts is not None:
            family = CounterMetricFamily(
                "ingero_fleet_verdicts",
                "Jobs whose sacct verdict (AdminComment) was settled, by outcome.",
                labels=["outcome"],
            )
            for outcome, n in sorted(self.verdicts().items()):
                family.add_metric([outcome], n)
            yield family
        if self.verdict_failures is not None:
            yield CounterMetricFamily(
                "ingero_fleet_verdict_failures",
                "Slurm calls of the verdict writer that failed (each is retried).",
                value=self.verdict_failures(),
            )
        if self.resumes is not None:
            family = CounterMetricFamily(
                "ingero_fleet_idle_resumes",
                "Idle drained nodes ingero resumed, or refused to, by outcome and reason.",
                labels=["outcome", "reason"],
            )
            for (outcome, reason), n in sorted(self.resumes().items()):
                family.add_metric([outcome, reason], n)
            yield family


@dataclass(frozen=True)
class EchoForwarding:
    """What the Echo forwarder has done and holds, by kind (``events``, ``scores``)."""

    sent: Mapping[str, int]
    dropped: Mapping[tuple[str, str], int]  # (kind, reason: full|rejected|at_close)
    queued: Mapping[str, int]  # waiting now, in memory or in the spool, batch in flight too
    retries: int
    spool_bytes: int | None = None  # event JSON in the spool; None without a spool


class _EchoForwarding(Collector):
    """Read at scrape time from the forwarder: no second set of counters to keep."""

    def __init__(self) -> None:
        self.read: Callable[[], EchoForwarding] | None = None

    def collect(self) -> Iterator[Metric]:
        if self.read is None:
            return
        f = self.read()
        sent = CounterMetricFamily(
            "ingero_fleet_echo_sent", "Events and score samples Echo acknowledged.", labels=["kind"]
        )
        for kind, n in sorted(f.sent.items()):
            sent.add_metric([kind], n)
        yield sent
        dropped = CounterMetricFamily(
            "ingero_fleet_echo_dropped",
            "Events and score samples not forwarded to Echo, by reason (full: the queue or "
            "spool was at its bound; rejected: Echo refused them; at_close: left at shutdown "
            "without a spool).",
            labels=["kind", "reason"],
        )
        for (kind, reason), n in sorted(f.dropped.items()):
            dropped.add_metric([kind, reason], n)
        yield dropped
        yield CounterMetricFamily(
            "ingero_fleet_echo_retries",
            "Batches sent to Echo again after a failure (Echo down or slow).",
            value=f.retries,
        )
        queued = GaugeMetricFamily(
            "ingero_fleet_echo_queued",
            "Events and score samples waiting for Echo (the batch in flight included).",
            labels=["kind"],
        )
        for kind, n in sorted(f.queued.items()):
            queued.add_metric([kind], n)
        yield queued
        if f.spool_bytes is not None:
            yield GaugeMetricFamily(
                "ingero_fleet_echo_spool_bytes",
                "Bytes of event JSON in the durable spool (echo.spool_max_bytes bounds it).",
                value=f.spool_bytes,
            )


class FleetMetrics:
    """Counters for the receivers (hot path: cached label children), per-group gauges and,
    opted in, per-node gauges for at most ``node_series_limit`` nodes."""

    def __init__(
        self, node_series_limit: int | None = None, clock_offset_limit: int = 1000
    ) -> None:
        self.registry = daemon_registry("fleet", auto_describe=True)
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
        self.owned_clusters = Gauge(
            "ingero_fleet_owned_clusters",
            "Clusters that pushed to this replica within the last two push intervals.",
            registry=r,
        )
        self.takeovers = Counter(
            "ingero_fleet_cluster_takeovers",
            "Clusters this replica took over: first push, or first after the node TTL.",
            registry=r,
        )
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
        # NCCL communicators joined across ranks.
        self.nccl_episodes = Counter(
            "ingero_fleet_nccl_episodes",
            "NCCL episodes Fleet opened, by type: peer_lag (a rank consistently late into "
            "collectives), collective_wait (a communicator stopped at one collective) and "
            "collective_hang (ranks stuck in one collective).",
            ("type",),
            registry=r,
        )
        self.nccl_comms = Gauge(
            "ingero_fleet_nccl_communicators", "NCCL communicators Fleet joins.", registry=r
        )
        self.nccl_hung = Gauge(
            "ingero_fleet_nccl_hung_communicators",
            "NCCL communicators with ranks inside one collective past nccl.hang_after.",
            registry=r,
        )
        self.nccl_waiting = Gauge(
            "ingero_fleet_nccl_waiting_communicators",
            "NCCL communicators stopped at one collective past nccl.wait_after (open "
            "collective_wait episodes): their ranks wait for the ones named, or for none.",
            registry=r,
        )
        self.nccl_waiting_nodes = Gauge(
            "ingero_fleet_nccl_waiting_nodes",
            "Nodes whose NCCL ranks wait at a collective for other ranks (waiting, not "
            "stragglers).",
            registry=r,
        )
        self.nccl_refused = Counter(
            "ingero_fleet_nccl_refused",
            "Communicators refused by nccl.max_comms or nccl.max_comms_per_group, or whose "
            "rank count disagreed with the first report of that hash.",
            registry=r,
        )
        self._nccl_refused_seen = 0
        self.clock_offset_limit = clock_offset_limit
        self._clock_offsets: tuple[tuple[str, str, float], ...] = ()
        self._drain_failures = _DrainFailures(lambda: 0)
        r.register(self._drain_failures)
        self.slurm_counts = _SlurmCounts()
        r.register(self.slurm_counts)
        self._echo = _EchoForwarding()
        r.register(self._echo)
        self._children: dict[tuple[str, ...], MetricWrapperBase] = {}
        self._groups: tuple[GroupStats, ...] = ()
        self.node_series_limit = node_series_limit
        self._nodes: tuple[tuple[NodeRow, bool], ...] = ()
        self._nodes_omitted = 0
        # The idle GPU time gauges (ingero.fleet.idle_gpus), rendered at scrape time.
        self._idle_gpus: Callable[[frozenset[str] | None], bytes] = lambda _clusters: b""

    def read_drain_failures(self, read: Callable[[], int]) -> None:
        """Where ``ingero_fleet_drain_failures_total`` comes from (0 while drain is off)."""
        self._drain_failures.read = read

    def read_idle_gpus(self, render: Callable[[frozenset[str] | None], bytes]) -> None:
        """Where the ``ingero_fleet_idle_gpu*`` series come from."""
        self._idle_gpus = render

    def read_echo_forwarding(self, read: Callable[[], EchoForwarding]) -> None:
        """Where the ``ingero_fleet_echo_*`` series come from (none without an Echo)."""
        self._echo.read = read

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
        """Keep the last tick's groups; their gauges are written at scrape time.

        prometheus-client objects cost about 20 µs per group and tick to update and 100 µs
        per group to render (a 1 s stall of the whole process at 10,000 groups), so the
        per-group gauges are formatted straight from the snapshot instead, which also drops
        the series of vanished groups by construction.
        """
        self._groups = tuple(groups)
        self.groups.set(len(self._groups))

    def update_nodes(
        self, rows: Iterable[NodeRow], stragglers: set[tuple[str, str]], live_nodes: int
    ) -> None:
        """Keep the nodes whose series the next scrapes show (tick thread; opted in only).

        ``rows`` are the nodes chosen for series (``FleetState.scores_snapshot(lowest=...)``:
        stragglers first, then the lowest scores), ``stragglers`` holds (cluster_id,
        node_id), ``live_nodes`` counts the active and idle nodes of the tick.
        """
        if self.node_series_limit is None:
            return
        marked = [(row, (row.cluster_id, row.node_id) in stragglers) for row in rows]
        self._nodes = tuple(sorted(marked, key=lambda m: (m[0].cluster_id, m[0].node_id)))
        self._nodes_omitted = max(0, live_nodes - len(marked))

    def update_nccl(
        self,
        comms: int,
        hung: int,
        refused: int,
        opened: Iterable[str],
        waiting: int = 0,
        waiting_nodes: int = 0,
    ) -> None:
        """A tick's NCCL figures: ``refused`` is the join's running total, ``opened`` the
        types of the episodes that began this tick, ``waiting`` the communicators stopped
        at a collective and ``waiting_nodes`` the nodes whose ranks wait in one."""
        self.nccl_comms.set(comms)
        self.nccl_hung.set(hung)
        self.nccl_waiting.set(waiting)
        self.nccl_waiting_nodes.set(waiting_nodes)
        if refused > self._nccl_refused_seen:
            self.nccl_refused.inc(refused - self._nccl_refused_seen)
        self._nccl_refused_seen = refused
        for kind in opened:
            self.nccl_episodes.labels(kind).inc()

    def update_clock_offsets(self, offsets: Iterable[tuple[str, str, float, float]]) -> None:
        """The nodes' clock offsets to Fleet as they report them: (cluster_id, node_id,
        offset s, uncertainty s). At most ``clock_offset_limit`` series, the largest
        offsets first (what the clock-skew alert looks for)."""
        rows = sorted(offsets, key=lambda o: -abs(o[2]))[: self.clock_offset_limit]
        self._clock_offsets = tuple(sorted((c, n, off) for c, n, off, _ in rows))

    def render(self) -> bytes:
        text = generate_latest(self.registry) + render_groups(self._groups)
        text += render_clock_offsets(self._clock_offsets)
        if self.node_series_limit is not None:
            text += render_nodes(self._nodes, self._nodes_omitted)
        return text + self._idle_gpus(None)

    def render_clusters(self, clusters: frozenset[str]) -> bytes:
        """``/metrics`` for a token scoped to ``clusters``: only the series labelled with one
        of them (per-group gauges, clock offsets, per-node series). The Fleet-wide series
        (requests, refusals, ticks, totals, node_series_omitted) sum every tenant's and are
        left out."""
        groups = [g for g in self._groups if g.cluster_id in clusters]
        text = render_groups(groups)
        text += render_clock_offsets([o for o in self._clock_offsets if o[0] in clusters])
        if self.node_series_limit is not None:
            text += render_nodes([n for n in self._nodes if n[0].cluster_id in clusters], None)
        return text + self._idle_gpus(clusters)


def _number(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_groups(groups: Sequence[GroupStats]) -> bytes:
    """The per-group gauges in the Prometheus text format (0.0.4)."""
    labels = [f'{{cluster_id="{_label(g.cluster_id)}",group="{_label(g.group)}"}} ' for g in groups]
    lines: list[str] = []
    for name, help_text, value in _GROUP_GAUGES:
        lines.append(f"# HELP ingero_fleet_{name} {help_text}\n# TYPE ingero_fleet_{name} gauge\n")
        for label, g in zip(labels, groups, strict=True):
            lines.append(f"ingero_fleet_{name}{label}{_number(value(g))}\n")
    return "".join(lines).encode()


_GROUP_GAUGES: tuple[tuple[str, str, Callable[[GroupStats], float | None]], ...] = (
    ("threshold", "Smoothed straggler threshold of the group (raw without quorum).",
     lambda g: g.threshold),
    ("median", "Median health score of the group's active nodes.", lambda g: g.median),
    ("mad", "Median absolute deviation of the group's active scores.", lambda g: g.mad),
    ("noise", "Median over the group's active nodes of their score's change per measurement.",
     lambda g: g.noise),
    ("active_nodes", "Active nodes in the group.", lambda g: g.active_nodes),
    ("idle_nodes", "Idle nodes in the group (not in the statistics).", lambda g: g.idle_nodes),
    ("coverage_low", "1 when the cluster reports fewer nodes than expected.",
     lambda g: int(g.coverage_low)),
    ("panic_mode", "1 when the group is degraded as a whole.", lambda g: int(g.panic)),
    ("stragglers", "Nodes of the group in the straggler state.", lambda g: g.straggler_count),
    ("quorum_met", "1 when the group has enough active nodes for a threshold.",
     lambda g: int(g.quorum_met)),
)  # fmt: skip


_NODE_GAUGES: tuple[tuple[str, str, Callable[[NodeRow, bool], float]], ...] = (
    ("node_score", "The node's latest health score (0-1).", lambda n, _s: n.score),
    ("node_straggler", "1 while the node is in the straggler state.", lambda _n, s: int(s)),
    ("node_active", "1 for an active node, 0 for an idle one (not in the statistics).",
     lambda n, _s: int(n.state == "active")),
)  # fmt: skip


def render_nodes(nodes: Sequence[tuple[NodeRow, bool]], omitted: int | None) -> bytes:
    """The per-node gauges (``metrics.node_series``) and how many nodes the limit left out
    (``omitted``; None: not shown, a count over every cluster)."""
    labels = [
        f'{{cluster_id="{_label(n.cluster_id)}",group="{_label(n.group)}",'
        f'job_id="{_label(n.job_id or "")}",node_id="{_label(n.node_id)}"}} '
        for n, _ in nodes
    ]
    lines: list[str] = []
    for name, help_text, value in _NODE_GAUGES:
        lines.append(f"# HELP ingero_fleet_{name} {help_text}\n# TYPE ingero_fleet_{name} gauge\n")
        for label, (node, straggler) in zip(labels, nodes, strict=True):
            lines.append(f"ingero_fleet_{name}{label}{_number(value(node, straggler))}\n")
    if omitted is not None:
        lines.append(
            "# HELP ingero_fleet_node_series_omitted Nodes without per-node series "
            "(over metrics.node_series_limit).\n"
            "# TYPE ingero_fleet_node_series_omitted gauge\n"
            f"ingero_fleet_node_series_omitted {omitted}\n"
        )
    return "".join(lines).encode()


def render_clock_offsets(offsets: Sequence[tuple[str, str, float]]) -> bytes:
    """``ingero_fleet_node_clock_offset_seconds``: what each node adds to its clock to read
    Fleet's (the series docs/design.md reserved; contrib's IngeroClockSkew reads it)."""
    lines = [
        "# HELP ingero_fleet_node_clock_offset_seconds What the node adds to its clock to "
        "read Fleet's, as the node estimates it from push round trips.\n"
        "# TYPE ingero_fleet_node_clock_offset_seconds gauge\n"
    ]
    for cluster_id, node_id, offset in offsets:
        lines.append(
            f'ingero_fleet_node_clock_offset_seconds{{cluster_id="{_label(cluster_id)}",'
            f'node_id="{_label(node_id)}"}} {_number(offset)}\n'
        )
    return "".join(lines).encode()
