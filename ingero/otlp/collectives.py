"""NCCL collective reports in the health push: a node's communicators, the sequence number
each of its ranks has reached, a bounded sample of its collectives' entry and return times,
and the node's clock offset to Fleet, so Fleet can join the ranks of one communicator
across hosts (who entered collective #N last, who never entered it).

Wire form (additive to the health push, docs/design.md "Contracts"): in the same
``ExportMetricsServiceRequest`` resource as the node's score,

- gauge ``ingero.nccl.comm`` (unit ``{collective}``): one point per (communicator, rank)
  the node holds; its value is the last collective sequence number the rank entered; its
  attributes (``ATTR_*`` below) carry the communicator hash, the rank, what is in flight and
  the sampled calls, packed in one bytes attribute (``ingero.nccl.packed``, its op names in
  ``ingero.nccl.packed_ops``: see :data:`PACKED_CALL_BYTES`) or, from an older node, as
  parallel arrays (``ingero.nccl.seqs``, ``…entered``, ``…returned``, ``…ops``,
  ``…bytes``); times are the node's own Unix nanoseconds;
- gauge ``ingero.node.clock.offset`` (unit ``s``): what the node adds to its own clock to
  read Fleet's, attribute ``ingero.clock.uncertainty`` (s, half the round trip it came from).

Sizes are bounded whatever the collective rate: at most :data:`MAX_COMMS` communicators per
push, :data:`MAX_CALLS` calls per communicator and :data:`MAX_CALLS_PER_PUSH` in all, picked
by :func:`sample_calls` with one stride per communicator, so that its ranks send the same
sequence numbers.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple, cast

from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric, ScopeMetrics

from ingero.otlp.build import build
from ingero.otlp.values import add_attributes, attributes_dict

COMM_METRIC = "ingero.nccl.comm"
CLOCK_OFFSET_METRIC = "ingero.node.clock.offset"

ATTR_COMM_HASH = "ingero.nccl.comm_hash"
ATTR_COMM_RANK = "ingero.nccl.rank"
ATTR_NRANKS = "ingero.nccl.nranks"
ATTR_RETURNED_SEQ = "ingero.nccl.returned_seq"
ATTR_CALLS = "ingero.nccl.calls"
ATTR_LAST_ENTER = "ingero.nccl.last_enter_unix_nano"
# Added: when the rank's state was true (the end of the tracer interval it was read from).
ATTR_AS_OF = "ingero.nccl.as_of_unix_nano"
ATTR_INFLIGHT_SEQ = "ingero.nccl.inflight_seq"
ATTR_INFLIGHT_OP = "ingero.nccl.inflight_op"
ATTR_INFLIGHT_SINCE = "ingero.nccl.inflight_since_unix_nano"
ATTR_WAIT_NS = "ingero.nccl.wait_ns"
ATTR_DROPPED = "ingero.nccl.dropped"
ATTR_SEQS = "ingero.nccl.seqs"
ATTR_ENTERED = "ingero.nccl.entered_unix_nano"
ATTR_RETURNED = "ingero.nccl.returned_unix_nano"
ATTR_OPS = "ingero.nccl.ops"
ATTR_BYTES = "ingero.nccl.bytes"
ATTR_PACKED = "ingero.nccl.packed"
ATTR_PACKED_OPS = "ingero.nccl.packed_ops"
ATTR_CLOCK_UNCERTAINTY = "ingero.clock.uncertainty"

# Bounds of one push, whatever the node's collective rate (docs/design.md). A point is one
# (communicator, rank): a node with 8 GPUs holds 8 ranks of its job's communicator.
MAX_COMMS = 64
MAX_CALLS = 64
MAX_CALLS_PER_PUSH = 1024
MAX_OP_CHARS = 64
MAX_NRANKS = 1 << 20

_HASH = re.compile(r"[0-9a-f]{16}")

# ``ingero.nccl.packed`` holds n sampled calls as five little-endian columns of n items:
# seq, entered_unix_nano, returned_unix_nano (0: in flight) and bytes as int64 (>= 0), then
# the op as uint8, an index into ``ingero.nccl.packed_ops`` (the distinct op names). One
# bytes value, unpacked in one struct call, instead of five arrays of n ``AnyValue``
# objects, each read through the protobuf object model: Fleet's receiver takes about 0.8 of
# the time for a push of 16 calls (docs/benchmarks.md#where-a-full-pushs-time-goes).
PACKED_CALL_BYTES = 4 * 8 + 1
_PACKED = tuple(struct.Struct(f"<{4 * n}q{n}B") for n in range(MAX_CALLS + 1))


class CollectiveCall(NamedTuple):
    """One collective of one rank: its sequence number on the communicator, the op, when the
    rank entered it and when it returned (None: still in flight), on the node's clock.
    A named tuple, not a frozen dataclass: a push decodes up to 1,024 of them, and a tuple
    is built in a third of the time."""

    seq: int
    op: str
    entered_ns: int
    returned_ns: int | None = None
    bytes: int = 0


# A call from a (seq, op, entered_ns, returned_ns, bytes) tuple without a Python-level call
# (``_make`` is one): the decoder builds up to 1,024 per push.
_new_call = cast(
    Callable[[tuple[int, str, int, int | None, int]], CollectiveCall],
    partial(tuple.__new__, CollectiveCall),
)


@dataclass(frozen=True)
class CommReport:
    """One rank's view of one communicator over the push interval.

    ``entered_seq`` is the last collective the rank entered (0: none yet) and
    ``returned_seq`` the last that returned; ``inflight_*`` name the oldest collective it
    entered and has not returned from (None: nothing in flight); ``calls`` is the sample
    of the interval's collectives, in sequence order; ``dropped`` counts the interval's
    collectives left out of it (on the node or by :func:`sample_calls`).
    """

    comm_hash: str
    comm_rank: int
    nranks: int
    entered_seq: int
    returned_seq: int = 0
    calls_in_interval: int = 0
    last_enter_ns: int | None = None
    inflight_seq: int | None = None
    inflight_op: str | None = None
    inflight_since_ns: int | None = None
    wait_ns: int = 0
    dropped: int = 0
    calls: tuple[CollectiveCall, ...] = ()
    # The node time (ns) the report is as of: the end of the tracer interval its state was
    # read from (None: an older node; the push's arrival stands in).
    as_of_ns: int | None = None


@dataclass(frozen=True)
class ClockOffset:
    """Fleet's clock minus the node's (s), and the bound on its error (s, >= 0)."""

    offset_s: float
    uncertainty_s: float


@dataclass
class CollectivesDecode:
    """The communicators and clock offset of one resource, and what was refused (why)."""

    comms: list[CommReport] = field(default_factory=list)
    clock: ClockOffset | None = None
    errors: list[str] = field(default_factory=list)


def seq_stride(seqs: Sequence[int], limit: int = MAX_CALLS) -> int:
    """The stride :func:`sample_seqs` needs for ``seqs`` (increasing) alone: 1 when they
    fit in ``limit``, else the smallest power of two whose multiples (but the last seq)
    fit in ``limit - 1``."""
    if len(seqs) <= limit or limit < 2:
        return 1
    stride = 2
    while sum(1 for s in seqs[:-1] if s % stride == 0) > limit - 1:
        stride *= 2
    return stride


def shared_stride(seq_lists: Iterable[Sequence[int]], limit: int = MAX_CALLS) -> int:
    """One stride for the ranks of a communicator: the largest any of them needs, so each
    keeps the same multiples and none exceeds ``limit``."""
    return max((seq_stride(seqs, limit) for seqs in seq_lists), default=1)


def sample_seqs(seqs: Sequence[int], limit: int = MAX_CALLS, stride: int = 1) -> list[int]:
    """At most ``limit`` of ``seqs`` (increasing): all of them when they fit and ``stride``
    is 1, else those that are multiples of ``stride`` (raised to the smallest power of two
    that makes them fit), plus the last. Power-of-two strides nest, so two ranks whose
    counts differ a little keep the same multiples of the larger stride, and the ranks of
    one push, given one :func:`shared_stride`, keep exactly the same multiples."""
    if limit <= 1:
        return list(seqs[-1:]) if limit == 1 else []
    stride = max(stride, seq_stride(seqs, limit))
    if stride == 1:
        return list(seqs)
    return [*(s for s in seqs[:-1] if s % stride == 0), *seqs[-1:]]


def sample_calls(
    calls: Sequence[CollectiveCall], limit: int = MAX_CALLS, stride: int = 1
) -> list[CollectiveCall]:
    """At most ``limit`` of ``calls`` (in sequence order), picked by :func:`sample_seqs`
    (which the node's reader also applies to the seqs alone, before it reads the calls)."""
    if len(calls) <= limit and stride == 1:
        return list(calls)
    keep = sample_seqs([c.seq for c in calls], limit, stride)
    if not keep:
        return []
    multiples = set(keep[:-1])
    return [*(c for c in calls[:-1] if c.seq in multiples), calls[-1]]


def encode_collectives(
    sm: ScopeMetrics,
    comms: Iterable[CommReport],
    clock: ClockOffset | None,
    time_unix_nano: int,
    packed: bool = True,
) -> None:
    """Append the node's communicators and clock offset to its health push's scope;
    ``packed=False`` writes the sampled calls as parallel arrays, as older nodes do."""
    reports = list(comms)[:MAX_COMMS]
    # Fewer calls each when many ranks share the push; a power of two, so the strides that
    # sample_calls picks still nest with those of a node holding fewer ranks.
    per_comm = MAX_CALLS
    while reports and per_comm * len(reports) > MAX_CALLS_PER_PUSH:
        per_comm //= 2
    # One stride per communicator: its ranks on this node send the same sequence numbers.
    by_comm: dict[str, list[list[int]]] = {}
    for comm in reports:
        by_comm.setdefault(comm.comm_hash, []).append([c.seq for c in comm.calls])
    strides = {h: shared_stride(seqs, per_comm) for h, seqs in by_comm.items()}
    if reports:
        metric = sm.metrics.add()
        metric.name = COMM_METRIC
        metric.unit = "{collective}"
        for comm in reports:
            calls = sample_calls(comm.calls, per_comm, strides[comm.comm_hash])
            point = metric.gauge.data_points.add()
            point.time_unix_nano = time_unix_nano
            point.as_int = comm.entered_seq
            attrs: dict[str, Any] = {
                ATTR_COMM_HASH: comm.comm_hash,
                ATTR_COMM_RANK: comm.comm_rank,
                ATTR_NRANKS: comm.nranks,
                ATTR_RETURNED_SEQ: comm.returned_seq,
                ATTR_CALLS: comm.calls_in_interval,
                ATTR_LAST_ENTER: comm.last_enter_ns,
                ATTR_AS_OF: comm.as_of_ns,
                ATTR_INFLIGHT_SEQ: comm.inflight_seq,
                ATTR_INFLIGHT_OP: comm.inflight_op,
                ATTR_INFLIGHT_SINCE: comm.inflight_since_ns,
                ATTR_WAIT_NS: comm.wait_ns,
                ATTR_DROPPED: comm.dropped + len(comm.calls) - len(calls),
            }
            if calls and packed:
                attrs[ATTR_PACKED], attrs[ATTR_PACKED_OPS] = pack_calls(calls)
            elif calls:  # the form of older nodes
                attrs[ATTR_SEQS] = [c.seq for c in calls]
                attrs[ATTR_ENTERED] = [c.entered_ns for c in calls]
                attrs[ATTR_RETURNED] = [c.returned_ns or 0 for c in calls]
                attrs[ATTR_OPS] = [c.op for c in calls]
                attrs[ATTR_BYTES] = [c.bytes for c in calls]
            add_attributes(point.attributes, attrs)
    if clock is not None:
        metric = sm.metrics.add()
        metric.name = CLOCK_OFFSET_METRIC
        metric.unit = "s"
        point = metric.gauge.data_points.add()
        point.time_unix_nano = time_unix_nano
        point.as_double = clock.offset_s
        add_attributes(point.attributes, {ATTR_CLOCK_UNCERTAINTY: clock.uncertainty_s})


def pack_calls(calls: Sequence[CollectiveCall]) -> tuple[bytes, list[str]]:
    """``calls`` (at most MAX_CALLS) as ``ingero.nccl.packed`` and its op names."""
    names: dict[str, int] = {}
    index = [names.setdefault(c.op, len(names)) for c in calls]
    data = _PACKED[len(calls)].pack(
        *[c.seq for c in calls],
        *[c.entered_ns for c in calls],
        *[c.returned_ns or 0 for c in calls],
        *[c.bytes for c in calls],
        *index,
    )
    return data, list(names)


def _unpacked(
    comm_hash: str, data: object, names: object
) -> tuple[list[int], list[str], Sequence[int], Sequence[int], Sequence[int]]:
    """(seqs, ops, entered, returned, bytes) of ``ingero.nccl.packed``; ValueError why not."""
    n, rest = divmod(len(data), PACKED_CALL_BYTES) if isinstance(data, bytes) else (-1, 0)
    if not isinstance(data, bytes) or rest or n > MAX_CALLS:
        raise ValueError(
            f"communicator {comm_hash}: {ATTR_PACKED} is not bytes of at most {MAX_CALLS} "
            f"calls of {PACKED_CALL_BYTES} bytes"
        )
    if (
        type(names) is not list
        or len(names) > MAX_CALLS
        or [o for o in names if type(o) is not str or not 0 < len(o) <= MAX_OP_CHARS]
    ):
        raise ValueError(f"communicator {comm_hash}: {ATTR_PACKED_OPS} is not a list of op names")
    values = _PACKED[n].unpack(data)
    if n and min(values[: 4 * n]) < 0:
        raise ValueError(f"communicator {comm_hash}: {ATTR_PACKED} holds a negative value")
    if n and max(values[4 * n :]) >= len(names):
        raise ValueError(f"communicator {comm_hash}: {ATTR_PACKED} names an op it does not list")
    ops = [names[i] for i in values[4 * n :]]
    return list(values[:n]), ops, values[n : 2 * n], values[2 * n : 3 * n], values[3 * n : 4 * n]


def is_collectives_metric(name: str) -> bool:
    return name in (COMM_METRIC, CLOCK_OFFSET_METRIC)


def decode_collectives_metric(metric: Metric, out: CollectivesDecode) -> None:
    """One ``ingero.nccl.comm`` or ``ingero.node.clock.offset`` metric into ``out``; a point
    that is not sane is left out with a one-line reason in ``out.errors``."""
    if metric.WhichOneof("data") != "gauge":
        out.errors.append(f"{metric.name} must be a gauge")
        return
    for point in metric.gauge.data_points:
        attrs = attributes_dict(point.attributes)
        kind = point.WhichOneof("value")
        # an int stays an int: a sequence number past 2**53 would not survive a float
        value: int | float = point.as_int if kind == "as_int" else point.as_double
        try:
            if metric.name == CLOCK_OFFSET_METRIC:
                out.clock = _clock(value, attrs)
            elif len(out.comms) >= MAX_COMMS:
                raise ValueError(f"more than {MAX_COMMS} communicators in one push")
            else:
                out.comms.append(_comm(value, attrs))
        except ValueError as exc:
            out.errors.append(f"{metric.name}: {exc}")


def _clock(value: int | float, attrs: dict[str, Any]) -> ClockOffset:
    uncertainty = attrs.get(ATTR_CLOCK_UNCERTAINTY)
    if not math.isfinite(value):
        raise ValueError(f"offset {value!r} is not finite")
    if (
        isinstance(uncertainty, bool)
        or not isinstance(uncertainty, int | float)
        or not math.isfinite(uncertainty)
        or uncertainty < 0
    ):
        raise ValueError(f"{ATTR_CLOCK_UNCERTAINTY} {uncertainty!r} is not a number >= 0")
    return ClockOffset(float(value), float(uncertainty))


def _count(attrs: dict[str, Any], name: str, default: int | None = 0) -> int | None:
    value = attrs.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} {value!r} is not a count")
    return value


def _ints(attrs: dict[str, Any], name: str, n: int) -> list[int]:
    value = attrs.get(name, [])
    # The common case in one pass of comprehensions (every push carries five such lists);
    # anything else takes the item-by-item checks below, which say what is wrong.
    if (
        type(value) is list
        and len(value) == n
        and not [item for item in value if type(item) is not int or item < 0]
    ):
        return value
    if not isinstance(value, list) or len(value) != n:
        raise ValueError(f"{name} must be a list of {n} integers")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise ValueError(f"{name} holds {item!r}, not an integer >= 0")
    return value


def _arrays(
    comm_hash: str, attrs: dict[str, Any]
) -> tuple[list[int], list[str], list[int], list[int], list[int]]:
    """(seqs, ops, entered, returned, bytes) of the parallel arrays; ValueError why not."""
    seqs = attrs.get(ATTR_SEQS, [])
    n = len(seqs) if isinstance(seqs, list) else -1
    if not 0 <= n <= MAX_CALLS:
        raise ValueError(f"communicator {comm_hash}: {ATTR_SEQS} is not a list of <= {MAX_CALLS}")
    seqs = _ints(attrs, ATTR_SEQS, n)
    entered = _ints(attrs, ATTR_ENTERED, n)
    returned = _ints(attrs, ATTR_RETURNED, n)
    sizes = _ints(attrs, ATTR_BYTES, n)
    ops = attrs.get(ATTR_OPS, [])
    if not isinstance(ops, list) or len(ops) != n:
        raise ValueError(f"communicator {comm_hash}: {ATTR_OPS} must be a list of {n} names")
    if [o for o in ops if type(o) is not str or not 0 < len(o) <= MAX_OP_CHARS]:
        ops = [_op(o, ATTR_OPS) for o in ops]  # raises, naming the first bad one
    return seqs, ops, entered, returned, sizes


def _op(value: object, name: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_OP_CHARS:
        raise ValueError(f"{name} {value!r} is not an op name")
    return value


def _comm(value: int | float, attrs: dict[str, Any]) -> CommReport:
    comm_hash = attrs.get(ATTR_COMM_HASH)
    if not isinstance(comm_hash, str) or not _HASH.fullmatch(comm_hash):
        raise ValueError(f"{ATTR_COMM_HASH} {comm_hash!r} is not 16 lowercase hex digits")
    whole = isinstance(value, int) or (math.isfinite(value) and value.is_integer())
    if not (whole and value >= 0):
        raise ValueError(f"communicator {comm_hash}: sequence {value!r} is not a count")
    rank, nranks = _count(attrs, ATTR_COMM_RANK, None), _count(attrs, ATTR_NRANKS, None)
    if rank is None or nranks is None or not rank < nranks <= MAX_NRANKS:
        raise ValueError(f"communicator {comm_hash}: rank {rank!r} of {nranks!r} is not sane")
    packed = attrs.get(ATTR_PACKED)
    if packed is not None:  # the arrays of an older node, if any, are not read
        seqs, ops, entered, returned, sizes = _unpacked(
            comm_hash, packed, attrs.get(ATTR_PACKED_OPS, [])
        )
    else:
        seqs, ops, entered, returned, sizes = _arrays(comm_hash, attrs)
    if sorted(set(seqs)) != seqs:  # not strictly increasing
        raise ValueError(f"communicator {comm_hash}: {ATTR_SEQS} is not increasing")
    calls = tuple(
        map(_new_call, zip(seqs, ops, entered, [r or None for r in returned], sizes, strict=True))
    )
    inflight_op = attrs.get(ATTR_INFLIGHT_OP)
    return build(
        CommReport,
        comm_hash=comm_hash,
        comm_rank=rank,
        nranks=nranks,
        entered_seq=int(value),
        returned_seq=_count(attrs, ATTR_RETURNED_SEQ) or 0,
        calls_in_interval=_count(attrs, ATTR_CALLS) or 0,
        last_enter_ns=_count(attrs, ATTR_LAST_ENTER, None),
        inflight_seq=_count(attrs, ATTR_INFLIGHT_SEQ, None),
        inflight_op=None if inflight_op is None else _op(inflight_op, ATTR_INFLIGHT_OP),
        inflight_since_ns=_count(attrs, ATTR_INFLIGHT_SINCE, None),
        wait_ns=_count(attrs, ATTR_WAIT_NS) or 0,
        dropped=_count(attrs, ATTR_DROPPED) or 0,
        calls=calls,
        as_of_ns=_count(attrs, ATTR_AS_OF, None),
    )
