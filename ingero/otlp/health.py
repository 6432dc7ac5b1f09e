"""The health push, a node's score to Fleet (and Fleet's score history to Echo): its plain
type (:class:`NodePush`), its OTLP metrics encoder and its validating decoder, side by side.

Names are the public contract of DESIGN.md: resource attributes ``ingero.node.id``,
``ingero.cluster.id``, ``host.name``, ``ingero.gpu.model``, ``ingero.gpu.count``,
``ingero.provider``, ``ingero.inference.service``; gauge ``ingero.node.health_score`` with point attributes
``ingero.node.state``, ``ingero.workload_type``, ``slurm.job.id``, ``ingero.rank``,
``ingero.world_size``, ``ingero.dominant_signal``, ``ingero.node.stalled``,
``ingero.episode.id``, ``ingero.node.held``, ``ingero.node.cause_class``, ``ingero.node.quiet``,
``ingero.node.waiting``; gauge ``ingero.node.signal`` (attribute ``ingero.signal``) and gauge
``ingero.node.rate`` (attribute ``ingero.rate``).

OpenTelemetry conventions: the sender's ``service.*`` and the semantic-convention
``cloud.provider``/``hw.model`` on the resource (:mod:`ingero.otlp.resource`), and, beside the
mixed-unit ``ingero.node.rate``, one gauge per unit for the rates whose unit is known
(:data:`UNIT_GAUGES`); the decoder takes either.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric, NumberDataPoint, ScopeMetrics
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from ingero.otlp.build import build
from ingero.otlp.collectives import (
    ClockOffset,
    CollectivesDecode,
    CommReport,
    decode_collectives_metric,
    encode_collectives,
    is_collectives_metric,
)
from ingero.otlp.limits import MAX_ID_CHARS, TOO_LONG, ValueTooLong, check_length, shown
from ingero.otlp.resource import CLOUD_PROVIDER, HW_MODEL
from ingero.otlp.values import add_attributes, any_to_python
from ingero.schema.causes import CAUSE_CLASSES

SCORE_METRIC = "ingero.node.health_score"
SIGNAL_METRIC = "ingero.node.signal"
RATE_METRIC = "ingero.node.rate"

ATTR_NODE_ID = "ingero.node.id"
ATTR_CLUSTER_ID = "ingero.cluster.id"
ATTR_HOST_NAME = "host.name"
ATTR_GPU_MODEL = "ingero.gpu.model"
ATTR_GPU_COUNT = "ingero.gpu.count"
ATTR_PROVIDER = "ingero.provider"
ATTR_STATE = "ingero.node.state"
ATTR_WORKLOAD = "ingero.workload_type"
ATTR_JOB_ID = "slurm.job.id"
ATTR_RANK = "ingero.rank"
ATTR_WORLD_SIZE = "ingero.world_size"
ATTR_DOMINANT = "ingero.dominant_signal"
# Added: true while the node's job still runs but launches nothing (state stays active).
ATTR_STALLED = "ingero.node.stalled"
# Added: the node's open straggler episode; "" when it classifies itself and has none open,
# absent from an agent that does not (Fleet then cannot wait for the node's id).
ATTR_EPISODE = "ingero.episode.id"
# Whether the push repeats the node's last measurement (no new tracer interval since), on
# every push of an agent that says so: Fleet then counts the node's score once per new
# measurement. Absent from an agent that does not say (Fleet counts it at every tick).
ATTR_HELD = "ingero.node.held"
# Added: the remediation class of the node's slowness as the node sees it
# (ingero.schema.causes: hardware|node|network|job), on every push of an agent that says.
ATTR_CAUSE = "ingero.node.cause_class"
# Added, sent only when true: the node's newest tracer intervals hold no kernel launch
# while its job runs (quiet: stalled, waiting, or not yet either), and of such a node that
# it waits at an NCCL collective for a rank Fleet named (not stalled).
ATTR_QUIET = "ingero.node.quiet"
ATTR_WAITING = "ingero.node.waiting"
# Added (resource): the inference service the node's replica serves; groups nodes without
# a Slurm job (replicas of one model are peers).
ATTR_SERVICE = "ingero.inference.service"
ATTR_SIGNAL = "ingero.signal"
ATTR_RATE = "ingero.rate"

SCOPE_NAME = "ingero"

NodeState = Literal["calibrating", "active", "idle", "stale"]
NODE_STATES: frozenset[str] = frozenset({"calibrating", "active", "idle", "stale"})

# The raw rates (``ingero.node.rate`` names) Fleet compares within a peer group: a node's
# ratio to its group's median of them is its throughput against its peers.
KERNEL_LAUNCH_RATE = "kernel_launch_rate"
NCCL_RATE = "nccl_collective_rate"
STEP_RATE = "step_rate"
# CUDA graph replays per second, sent only by a node whose job launches graphs.
GRAPH_LAUNCH_RATE = "graph_launch_rate"
# An inference server's speed from its own /metrics (ingero.collectors.engines): tokens per
# second of one sequence (1 / mean per-output-token latency) and forward steps per second of
# step time (1 / mean step latency). Both are per-request speeds, not load: a router sends a
# slow replica less work, so its throughput can look like its peers' while its latency is not.
INFERENCE_TOKEN_RATE = "inference_token_rate"
INFERENCE_STEP_RATE = "inference_step_rate"
PEER_RATES: tuple[str, ...] = (
    KERNEL_LAUNCH_RATE,
    NCCL_RATE,
    STEP_RATE,
    GRAPH_LAUNCH_RATE,
    INFERENCE_TOKEN_RATE,
    INFERENCE_STEP_RATE,
)
# Which peer rate stands for a node's throughput, best first: an inference server's own
# per-request speed is what its users feel, steps are the work itself, collectives pace a
# distributed job, a graph replay is most often a step (or a captured part of one) where the
# job replays graphs, launches are what every traced node records.
THROUGHPUT_RATES: tuple[str, ...] = (
    INFERENCE_TOKEN_RATE,
    INFERENCE_STEP_RATE,
    STEP_RATE,
    NCCL_RATE,
    GRAPH_LAUNCH_RATE,
    KERNEL_LAUNCH_RATE,
)


# ``ingero.node.rate`` carries launches/s, steps/s and fractions in one instrument, which OTel
# backends cannot give one unit. These rates are also sent as a gauge of their own, with the
# OTLP ``unit`` (UCUM, annotations in braces). The others (e.g. ``throughput_baseline``, whose
# unit is whichever rate stands for throughput) stay only in ``ingero.node.rate``.
UNIT_GAUGES: dict[str, tuple[str, str]] = {
    KERNEL_LAUNCH_RATE: ("ingero.node.kernel_launch.rate", "{launch}/s"),
    NCCL_RATE: ("ingero.node.nccl_collective.rate", "{collective}/s"),
    STEP_RATE: ("ingero.node.step.rate", "{step}/s"),
    GRAPH_LAUNCH_RATE: ("ingero.node.graph_launch.rate", "{launch}/s"),
    INFERENCE_TOKEN_RATE: ("ingero.node.inference.token.rate", "{token}/s"),
    INFERENCE_STEP_RATE: ("ingero.node.inference.step.rate", "{step}/s"),
    "gpu_busy_fraction": ("ingero.node.gpu.busy", "1"),
    "gpu_busy_baseline": ("ingero.node.gpu.busy_baseline", "1"),
    "mem_free_fraction": ("ingero.node.memory.free", "1"),
    "cpu_busy_fraction": ("ingero.node.cpu.busy", "1"),
}
_RATE_OF_GAUGE: dict[str, str] = {metric: rate for rate, (metric, _) in UNIT_GAUGES.items()}


def group_key(
    cluster_id: str,
    job_id: str | None,
    workload_type: str | None,
    service: str | None = None,
) -> str:
    """The peer group a node is compared within: its Slurm job, else the inference service
    its replica belongs to, else cluster + workload."""
    if job_id:
        return f"{cluster_id}/job/{job_id}"
    if service:
        return f"{cluster_id}/service/{service}"
    return f"{cluster_id}/workload/{workload_type or 'unknown'}"


@dataclass(frozen=True)
class NodePush:
    """One health push of one node: what fleet-push encodes and Fleet's receivers decode."""

    node_id: str
    cluster_id: str
    score: float
    state: NodeState = "active"
    host_name: str | None = None
    job_id: str | None = None
    rank: int | None = None
    world_size: int | None = None
    workload_type: str | None = None
    dominant_signal: str | None = None
    signals: dict[str, float] = field(default_factory=dict)
    rates: dict[str, float] = field(default_factory=dict)
    gpu_model: str | None = None
    gpu_count: int | None = None
    provider: str | None = None
    # The job still runs here (job file, live processes) but the node launches nothing.
    stalled: bool = False
    # The node's open straggler episode; "" none open; None: the agent does not say.
    episode_id: str | None = None
    # The node's NCCL communicators over the interval and its clock offset
    # to Fleet (ingero.otlp.collectives); empty / None from an agent that does not send them.
    collectives: tuple[CommReport, ...] = ()
    clock: ClockOffset | None = None
    # The inference service (replicas of one model) the node serves; None: none.
    service: str | None = None
    # The push repeats the node's last measurement (nothing new measured since); None:
    # the agent does not say.
    held: bool | None = None
    # The remediation class of what slows the node (ingero.schema.causes); None: the
    # agent does not say.
    cause_class: str | None = None
    # Quiet: no kernel launch in the node's newest tracer intervals while its job runs;
    # waiting: quiet because a rank of it waits at a collective (Fleet's reply said for whom).
    quiet: bool = False
    waiting: bool = False

    @property
    def group(self) -> str:
        return group_key(self.cluster_id, self.job_id, self.workload_type, self.service)


# Rejection reasons, also the label values of ingero_fleet_rejected_total.
MISSING_NODE_ID = "missing_node_id"
MISSING_CLUSTER_ID = "missing_cluster_id"
BAD_SCORE = "bad_score"
BAD_ATTRIBUTE = "bad_attribute"
BAD_METRIC_TYPE = "bad_metric_type"
# and TOO_LONG (ingero.otlp.limits): an id or name over MAX_ID_CHARS.


@dataclass
class HealthDecode:
    """What a metrics request held: valid pushes with the time each was stamped with
    (``times[i]``, the ``time_unix_nano`` of ``pushes[i]``'s score point: everything
    :func:`encode_health` wrote), and the data points rejected (with why)."""

    pushes: list[NodePush] = field(default_factory=list)
    times: list[int] = field(default_factory=list)
    rejected: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)

    def reject(self, reason: str, message: str, count: int = 1) -> None:
        self.rejected += count
        self.reasons[reason] = self.reasons.get(reason, 0) + count
        if len(self.messages) < 5:  # enough to diagnose, bounded for a hostile request
            self.messages.append(message)

    @property
    def error_message(self) -> str:
        return "; ".join(self.messages)

    def timed(self) -> Iterator[tuple[NodePush, int]]:
        """(push, time_unix_nano) pairs, as :func:`encode_score_history` takes them."""
        return zip(self.pushes, self.times, strict=True)


class ScoredNode(Protocol):
    """A node's score as Fleet keeps it and forwards it as score history (``NodePush`` has
    these fields too): the push's identity, hardware and score point, none of its details."""

    @property
    def node_id(self) -> str: ...
    @property
    def cluster_id(self) -> str: ...
    @property
    def score(self) -> float: ...
    @property
    def state(self) -> str: ...
    @property
    def host_name(self) -> str | None: ...
    @property
    def job_id(self) -> str | None: ...
    @property
    def rank(self) -> int | None: ...
    @property
    def workload_type(self) -> str | None: ...
    @property
    def dominant_signal(self) -> str | None: ...
    @property
    def gpu_model(self) -> str | None: ...
    @property
    def gpu_count(self) -> int | None: ...
    @property
    def provider(self) -> str | None: ...


def encode_health(
    push: NodePush,
    time_unix_nano: int,
    service: dict[str, object] | None = None,
    *,
    nccl_packed: bool = True,
) -> ExportMetricsServiceRequest:
    """One node's push: its score gauge plus one point per signal and per raw rate.

    ``service``: the sender's ``service.*`` attributes (:func:`ingero.otlp.resource.
    service_attributes`), added to the resource. ``nccl_packed=False``: the sampled NCCL
    calls as parallel arrays, the form of older nodes (:mod:`ingero.otlp.collectives`).
    """
    request = ExportMetricsServiceRequest()
    sm = _score_gauge(
        request,
        push,
        time_unix_nano,
        service,
        inference_service=push.service,
        world_size=push.world_size,
        details={
            ATTR_STALLED: True if push.stalled else None,
            ATTR_EPISODE: push.episode_id,
            ATTR_HELD: push.held,
            ATTR_CAUSE: push.cause_class,
            ATTR_QUIET: True if push.quiet else None,
            ATTR_WAITING: True if push.waiting else None,
        },
    )
    for name, attr, values in (
        (SIGNAL_METRIC, ATTR_SIGNAL, push.signals),
        (RATE_METRIC, ATTR_RATE, push.rates),
    ):
        if not values:
            continue
        metric = sm.metrics.add()
        metric.name = name
        for key, value in values.items():
            p = metric.gauge.data_points.add()
            p.time_unix_nano = time_unix_nano
            p.as_double = value
            add_attributes(p.attributes, {attr: key})
    for key, value in push.rates.items():
        if key in UNIT_GAUGES:
            metric = sm.metrics.add()
            metric.name, metric.unit = UNIT_GAUGES[key]
            p = metric.gauge.data_points.add()
            p.time_unix_nano = time_unix_nano
            p.as_double = value
    if push.collectives or push.clock is not None:
        encode_collectives(sm, push.collectives, push.clock, time_unix_nano, nccl_packed)
    return request


def encode_score_history(
    samples: Iterable[tuple[ScoredNode, int]], service: dict[str, object] | None = None
) -> ExportMetricsServiceRequest:
    """Many nodes' scores in one request, each with its own time (Fleet's score history to
    Echo, from the scores Fleet keeps): per node the resource and score point of its health
    push (:func:`encode_health`) without the push's details; decoded by
    :func:`decode_health` as single pushes are."""
    request = ExportMetricsServiceRequest()
    for node, time_unix_nano in samples:
        _score_gauge(request, node, time_unix_nano, service)
    return request


def _score_gauge(
    request: ExportMetricsServiceRequest,
    node: ScoredNode,
    time_unix_nano: int,
    service: dict[str, object] | None,
    *,
    inference_service: str | None = None,
    world_size: int | None = None,
    details: dict[str, object] | None = None,
) -> ScopeMetrics:
    """Add the node's resource and its score gauge to ``request``, the attributes in the
    wire's order: the score's own, then a push's ``details``. Returns the scope the push's
    other metrics go in."""
    rm = request.resource_metrics.add()
    add_attributes(
        rm.resource.attributes,
        {
            **(service or {}),
            ATTR_NODE_ID: node.node_id,
            ATTR_CLUSTER_ID: node.cluster_id,
            ATTR_HOST_NAME: node.host_name,
            ATTR_GPU_MODEL: node.gpu_model,
            HW_MODEL: node.gpu_model,
            ATTR_GPU_COUNT: node.gpu_count,
            ATTR_PROVIDER: node.provider,
            CLOUD_PROVIDER: node.provider,
            ATTR_SERVICE: inference_service,
        },
    )
    sm = rm.scope_metrics.add()
    sm.scope.name = SCOPE_NAME
    score = sm.metrics.add()
    score.name = SCORE_METRIC
    score.unit = "1"
    point = score.gauge.data_points.add()
    point.time_unix_nano = time_unix_nano
    point.as_double = node.score
    add_attributes(
        point.attributes,
        {
            ATTR_STATE: node.state,
            ATTR_WORKLOAD: node.workload_type,
            ATTR_JOB_ID: node.job_id,
            ATTR_RANK: node.rank,
            ATTR_WORLD_SIZE: world_size,
            ATTR_DOMINANT: node.dominant_signal,
            **(details or {}),
        },
    )
    return sm


def _number(point: NumberDataPoint) -> float:
    # A non-zero (or NaN) double is the set kind (an unset oneof member reads as zero), so
    # the common point needs no oneof lookup.
    return point.as_double or (
        float(point.as_int) if point.WhichOneof("value") == "as_int" else point.as_double
    )


def _attributes(kvs: Iterable[KeyValue]) -> dict[str, Any]:
    """Attributes as a dict; scalars inline because this runs for every push (hot path)."""
    out: dict[str, Any] = {}
    for kv in kvs:
        value = kv.value
        text = value.string_value  # a non-empty string is the set kind: no oneof lookup
        if text:
            out[kv.key] = text
            continue
        kind = value.WhichOneof("value")
        if kind == "string_value":
            out[kv.key] = text
        elif kind is not None:
            out[kv.key] = getattr(value, kind) if kind[0] in "ibd" else any_to_python(value)
    return out


def _text(source: dict[str, Any], name: str) -> str | None:
    """A string attribute of at most MAX_ID_CHARS (ValueTooLong beyond); ints are accepted
    too (Slurm job ids are numbers to some clients)."""
    value = source.get(name)
    if value is None or value == "":
        return None
    if type(value) is str:  # the length test inline: this runs 8 times per push
        return value if len(value) <= MAX_ID_CHARS else check_length(name, value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a string, got {shown(value)}")
    return str(value)


def _integer(source: dict[str, Any], name: str) -> int | None:
    value = source.get(name)
    if value is None or value == "":
        return None
    if type(value) is int:
        return value
    # ASCII digits only (str.isdigit also takes "²", which int() refuses), and no longer
    # than an int64, so int() neither fails nor builds a huge number.
    if isinstance(value, str) and len(value) <= 20 and value.isascii():
        digits = value[1:] if value.startswith("-") else value
        if digits.isdigit():
            return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise ValueError(f"{name} must be an integer, got {shown(value)}")


def _flag(source: dict[str, Any], name: str) -> bool:
    value = source.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {shown(value)}")
    return value


def _cause(source: dict[str, Any]) -> str | None:
    value = _text(source, ATTR_CAUSE)
    if value is not None and value not in CAUSE_CLASSES:
        raise ValueError(f"{ATTR_CAUSE} {shown(value)} is not one of {list(CAUSE_CLASSES)}")
    return value


def _episode(source: dict[str, Any]) -> str | None:
    """The node's open episode id; "" (the agent classifies, none open) is kept as such."""
    if source.get(ATTR_EPISODE) == "":
        return ""
    return _text(source, ATTR_EPISODE)


def _gauge_points(metric: Metric) -> Iterable[NumberDataPoint] | None:
    points = metric.gauge.data_points  # an unset gauge reads as empty: no oneof lookup
    if points:
        return cast(Iterable[NumberDataPoint], points)
    kind = metric.WhichOneof("data")
    if kind == "gauge":
        return cast(Iterable[NumberDataPoint], metric.gauge.data_points)
    if kind == "sum":  # some SDKs export observed values as a non-monotonic sum
        return cast(Iterable[NumberDataPoint], metric.sum.data_points)
    return None


def _keyed_values(
    metric: Metric, key_attr: str, out: dict[str, float], result: HealthDecode
) -> None:
    points = _gauge_points(metric)
    if points is None:
        result.reject(BAD_METRIC_TYPE, f"{metric.name} must be a gauge")
        return
    for point in points:
        key = ""
        for kv in point.attributes:
            if kv.key == key_attr:
                key = kv.value.string_value
                break
        value = _number(point)
        if not key or not math.isfinite(value):
            result.reject(BAD_ATTRIBUTE, f"{metric.name} point needs {key_attr} and a finite value")
            continue
        try:
            out[check_length(key_attr, key)] = value
        except ValueTooLong as exc:
            result.reject(TOO_LONG, f"{metric.name} point: {exc}")


def _unit_gauge(metric: Metric, rate: str, out: dict[str, float], result: HealthDecode) -> None:
    """One per-unit gauge (UNIT_GAUGES) as the raw rate ``rate``: its last finite point."""
    points = _gauge_points(metric)
    if points is None:
        result.reject(BAD_METRIC_TYPE, f"{metric.name} must be a gauge")
        return
    for point in points:
        value = _number(point)
        if not math.isfinite(value):
            result.reject(BAD_ATTRIBUTE, f"{metric.name} point needs a finite value")
            continue
        out[rate] = value


def decode_health(
    request: ExportMetricsServiceRequest, details: bool = True, rates: bool | None = None
) -> HealthDecode:
    """Validate every ``ingero.node.health_score`` point; other metrics are ignored.

    ``details=False`` skips the per-signal and raw-rate gauges (left empty in the pushes):
    they are a third of the decoding time. ``rates`` overrides that for the raw rates alone
    (Fleet needs the score and the rates it compares between peers, not the signals).
    """
    want_rates = details if rates is None else rates
    result = HealthDecode()
    for rm in request.resource_metrics:
        scores: list[Metric] = []
        signals: dict[str, float] = {}
        rate_values: dict[str, float] = {}
        unit_rates: dict[str, float] = {}
        collectives: CollectivesDecode | None = None
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                name = metric.name
                if name == SCORE_METRIC:
                    scores.append(metric)
                elif name == SIGNAL_METRIC and details:
                    _keyed_values(metric, ATTR_SIGNAL, signals, result)
                elif name == RATE_METRIC and want_rates:
                    _keyed_values(metric, ATTR_RATE, rate_values, result)
                elif want_rates and name in _RATE_OF_GAUGE:
                    rate = _RATE_OF_GAUGE[name]
                    if rate not in rate_values:  # else that value wins: this one is not read
                        _unit_gauge(metric, rate, unit_rates, result)
                elif is_collectives_metric(name):
                    collectives = collectives or CollectivesDecode()
                    decode_collectives_metric(metric, collectives)
        if collectives is not None:
            for message in collectives.errors:
                result.reject(BAD_ATTRIBUTE, message)
        for key, value in unit_rates.items():  # a sender with only the per-unit gauges
            rate_values.setdefault(key, value)
        if scores:
            res = _resource(rm.resource)
            for metric in scores:
                _decode_scores(metric, res, signals, rate_values, result, collectives)
    return result


# A node sends the same resource with every push. Its fields, once read and found valid,
# are kept by the resource's bytes (serialising it costs a fifth of reading its ten or so
# attributes through the protobuf object model): about 0.8 KB a node, at most
# RESOURCE_CACHE resources of at most RESOURCE_KEY_BYTES each (~40 MB at worst), the cache
# emptied when full. A resource that is not valid is read again each time, to say why.
RESOURCE_CACHE = 32_768
RESOURCE_KEY_BYTES = 1024
# node id, cluster id, host name, GPU model, GPU count, provider, inference service
NodeFields = tuple[
    str | None, str | None, str | None, str | None, int | None, str | None, str | None
]
_resources: dict[bytes, NodeFields] = {}
_READ: dict[str, Any] = {}  # the attributes of a resource whose fields were kept


def _resource(resource: Resource) -> tuple[dict[str, Any], NodeFields | None]:
    """The resource's attributes and its fields (:func:`_node_fields`) where they are
    valid; a resource seen before: no attributes, its fields."""
    key = resource.SerializeToString()
    fields = _resources.get(key)
    if fields is not None:
        return _READ, fields
    res = _attributes(resource.attributes)
    try:
        fields = _node_fields(res)
    except ValueError:
        return res, None
    if len(key) <= RESOURCE_KEY_BYTES:
        if len(_resources) >= RESOURCE_CACHE:
            _resources.clear()
        _resources[key] = fields
    return res, fields


def _node_fields(res: dict[str, Any]) -> NodeFields:
    """A resource's fields (ValueError: one is not valid)."""
    return (
        _text(res, ATTR_NODE_ID),
        _text(res, ATTR_CLUSTER_ID),
        _text(res, ATTR_HOST_NAME),
        _text(res, ATTR_GPU_MODEL) or _text(res, HW_MODEL),
        _integer(res, ATTR_GPU_COUNT),
        _text(res, ATTR_PROVIDER) or _text(res, CLOUD_PROVIDER),
        _text(res, ATTR_SERVICE),
    )


def _decode_scores(
    metric: Metric,
    resource: tuple[dict[str, Any], NodeFields | None],
    signals: dict[str, float],
    rates: dict[str, float],
    result: HealthDecode,
    collectives: CollectivesDecode | None = None,
) -> None:
    points = _gauge_points(metric)
    if points is None:
        result.reject(BAD_METRIC_TYPE, f"{SCORE_METRIC} must be a gauge")
        return
    res, fields = resource
    for point in points:
        try:
            if fields is not None:
                node_id, cluster_id = fields[0], fields[1]
            else:
                node_id, cluster_id = _text(res, ATTR_NODE_ID), _text(res, ATTR_CLUSTER_ID)
        except ValueTooLong as exc:
            result.reject(TOO_LONG, f"resource attribute {exc}")
            continue
        except ValueError as exc:
            result.reject(BAD_ATTRIBUTE, f"resource attribute {exc}")
            continue
        if node_id is None:
            result.reject(MISSING_NODE_ID, f"resource attribute {ATTR_NODE_ID} is missing")
            continue
        if cluster_id is None:
            result.reject(
                MISSING_CLUSTER_ID,
                f"node {node_id}: resource attribute {ATTR_CLUSTER_ID} is missing",
            )
            continue
        score = _number(point)
        if not (math.isfinite(score) and 0.0 <= score <= 1.0):
            result.reject(BAD_SCORE, f"node {node_id}: score {score!r} is not in [0, 1]")
            continue
        attrs = _attributes(point.attributes)
        state = attrs.get(ATTR_STATE) or "active"
        if state not in NODE_STATES:
            result.reject(
                BAD_ATTRIBUTE,
                f"node {node_id}: {ATTR_STATE} {shown(state)} is not one of {sorted(NODE_STATES)}",
            )
            continue
        try:
            _, _, host_name, gpu_model, gpu_count, provider, service = fields or _node_fields(res)
            push = build(
                NodePush,
                node_id=node_id,
                cluster_id=cluster_id,
                score=score,
                state=cast(NodeState, state),
                host_name=host_name,
                job_id=_text(attrs, ATTR_JOB_ID),
                rank=_integer(attrs, ATTR_RANK),
                world_size=_integer(attrs, ATTR_WORLD_SIZE),
                workload_type=_text(attrs, ATTR_WORKLOAD),
                dominant_signal=_text(attrs, ATTR_DOMINANT),
                signals=signals,
                rates=rates,
                gpu_model=gpu_model,
                gpu_count=gpu_count,
                provider=provider,
                stalled=_flag(attrs, ATTR_STALLED),
                episode_id=_episode(attrs),
                collectives=tuple(collectives.comms) if collectives else (),
                clock=collectives.clock if collectives else None,
                service=service,
                held=_flag(attrs, ATTR_HELD) if ATTR_HELD in attrs else None,
                cause_class=_cause(attrs),
                quiet=_flag(attrs, ATTR_QUIET),
                waiting=_flag(attrs, ATTR_WAITING),
            )
        except ValueTooLong as exc:
            result.reject(TOO_LONG, f"node {node_id}: {exc}")
            continue
        except ValueError as exc:
            result.reject(BAD_ATTRIBUTE, f"node {node_id}: {exc}")
            continue
        result.pushes.append(push)
        result.times.append(point.time_unix_nano)
