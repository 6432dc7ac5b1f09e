"""The one event schema every channel carries (UDS NDJSON, journald, OTLP logs, Echo).

An event is a flat record; the same ``event_id`` travels on every channel so consumers
can de-duplicate and join. Field names are a public contract (DESIGN.md): add, never rename.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ingero.schema.stacks import StackError, stack_from_json

# Stable journald MESSAGE_IDs, one per type (128-bit, as `journalctl --new-id128` makes them).
MESSAGE_IDS: dict[str, str] = {
    "straggler_state": "6f3c2a1e9b8d4c7a8e5f0a1b2c3d4e51",
    "straggler_resolved": "6f3c2a1e9b8d4c7a8e5f0a1b2c3d4e52",
    "node_drained": "6f3c2a1e9b8d4c7a8e5f0a1b2c3d4e53",
    "node_resumed": "6f3c2a1e9b8d4c7a8e5f0a1b2c3d4e54",
    "drain_skipped": "6f3c2a1e9b8d4c7a8e5f0a1b2c3d4e55",
    "group_degraded": "6f3c2a1e9b8d4c7a8e5f0a1b2c3d4e56",
    "detection_mode": "6f3c2a1e9b8d4c7a8e5f0a1b2c3d4e57",
    "job_summary": "6f3c2a1e9b8d4c7a8e5f0a1b2c3d4e58",
    "peer_lag": "6f3c2a1e9b8d4c7a8e5f0a1b2c3d4e59",
    # GPU hardware health, raised by fleet-push from NVML's readings (extra.gpu names the GPU).
    "gpu_throttle": "6f3c2a1e9b8d4c7a8e5f0a1b2c3d4e5a",
    "gpu_xid": "6f3c2a1e9b8d4c7a8e5f0a1b2c3d4e5b",
    "gpu_ecc": "6f3c2a1e9b8d4c7a8e5f0a1b2c3d4e5c",
    # NCCL: ranks of a communicator stuck in one collective (extra names the ranks
    # that never entered it, or none), raised by Fleet; a node's clock off Fleet's, by the node.
    "collective_hang": "6f3c2a1e9b8d4c7a8e5f0a1b2c3d4e70",
    "clock_skew": "6f3c2a1e9b8d4c7a8e5f0a1b2c3d4e71",
    # Where a stalled rank, or one Fleet names in a collective_hang or peer_lag, is in its
    # code: one snapshot of the job's Python stacks on the node (extra.stacks), raised by
    # the node under the episode's event_id.
    "stack_snapshot": "6f3c2a1e9b8d4c7a8e5f0a1b2c3d4e72",
    # GPUs a job holds and does not use (no process on them, or NVML 0% busy and no
    # launches) for fleet-push's gpu_idle.idle_after: an episode (extra.state start|end,
    # one event_id) naming the job, its user, extra.gpus and since when, raised by the node.
    "gpu_idle": "6f3c2a1e9b8d4c7a8e5f0a1b2c3d4e73",
    # NCCL: a communicator stopped at one collective, its ranks waiting for the ones that
    # have not entered it (extra names them), or for none (every rank stopped at it);
    # raised by Fleet long before a collective_hang's bound.
    "collective_wait": "6f3c2a1e9b8d4c7a8e5f0a1b2c3d4e74",
}
EVENT_TYPES = frozenset(MESSAGE_IDS)
# A group's state, and a hang or wait where every rank entered the collective, name no node.
_NO_NODE = frozenset({"group_degraded", "collective_hang", "collective_wait"})

# The Unix socket fleet-push writes NDJSON events to, where a consumer (``ingero sink``) listens.
EVENT_SOCKET = "/run/ingero/events.sock"

# journald PRIORITY per type: stragglers, drains and GPU faults are warnings (XIDs and ECC
# errors: errors), the rest notices.
_PRIORITY = {
    "straggler_state": 4,
    "node_drained": 4,
    "group_degraded": 4,
    "gpu_throttle": 4,
    "gpu_xid": 3,
    "gpu_ecc": 3,
    "peer_lag": 4,
    "collective_hang": 3,
    "clock_skew": 4,
    "stack_snapshot": 4,
    "collective_wait": 4,
}


def new_event_id() -> str:
    return str(uuid.uuid4())


@dataclass
class Event:
    """A straggler-related event. ``extra`` holds type-specific fields (reason, panic, …)."""

    type: str
    node_id: str
    cluster_id: str
    timestamp: float
    event_id: str = field(default_factory=new_event_id)
    job_id: str | None = None
    rank: int | None = None
    score: float | None = None
    threshold: float | None = None
    detection_mode: str | None = None
    dominant_signal: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.type not in EVENT_TYPES:
            raise ValueError(f"unknown event type {self.type!r}")
        if not self.node_id and self.type not in _NO_NODE:
            raise ValueError("an event needs a node_id")

    def to_dict(self) -> dict[str, Any]:
        """Flat JSON-ready mapping: the schema fields, then ``extra`` (which cannot shadow them)."""
        return _flat(asdict(self))  # a deep copy: the caller may change what it gets

    def to_json(self) -> str:
        # No copy: json.dumps only reads. asdict's deep copy was most of the cost of an
        # event's line, paid per event by Fleet's Echo spool on the receiver's thread.
        fields_now = {name: getattr(self, name) for name in _ALL_FIELDS}
        return json.dumps(_flat(fields_now), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Event:
        """Parse a mapping; raises ValueError with the offending field on bad input."""
        if not isinstance(data, dict):
            raise ValueError("an event must be a JSON object")
        if not data.keys() >= _REQUIRED:
            missing = [k for k in ("type", "node_id", "cluster_id", "timestamp") if k not in data]
            raise ValueError(f"event is missing {', '.join(missing)}")
        names = _FIELD_NAMES if cls is Event else {f.name for f in fields(cls)} - {"extra"}
        # This runs for every ingested event: one C-level subset test and copy when there are
        # no extras (OTLP records carry only schema fields), else one pass splits them off.
        extra: dict[str, Any] = {}
        if names.issuperset(data):
            kwargs = dict(data)
        else:
            kwargs = {}
            for key, value in data.items():
                if key in names:
                    kwargs[key] = value
                else:
                    extra[key] = value
        for key in ("type", "node_id", "cluster_id", "event_id"):
            if key in kwargs and not isinstance(kwargs[key], str):
                raise ValueError(f"event field {key} must be a string")
        for key in ("detection_mode", "dominant_signal"):
            value = kwargs.get(key)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"event field {key} must be a string")
        for key in ("timestamp", "score", "threshold"):
            value = kwargs.get(key)
            if type(value) is float and math.isfinite(value):
                continue  # the common case, already what the checks below would give
            if value is None and key != "timestamp":
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
            ):
                raise ValueError(f"event field {key} must be a finite number")
            kwargs[key] = float(value)
        rank = kwargs.get("rank")
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)):
            raise ValueError("event field rank must be an integer")
        job_id = kwargs.get("job_id")
        if job_id is not None and type(job_id) is not str:
            kwargs["job_id"] = str(job_id)
        event_id = kwargs.get("event_id")
        if event_id is not None and not _CANONICAL_UUID.fullmatch(event_id):
            try:
                uuid.UUID(event_id)  # the other spellings uuid accepts (braces, urn:, no dashes)
            except ValueError:
                raise ValueError("event field event_id must be a UUID") from None
        if extra and not _plain_json(extra):
            try:
                # The same check every channel's serialiser makes: refuse here, not in a sink.
                json.dumps(extra, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"event extra fields must be finite JSON values: {exc}") from None
        kwargs["extra"] = extra  # one dict for the call: `**kwargs, extra=extra` merges a copy
        return cls(**kwargs)

    def journal_fields(self) -> dict[str, str]:
        """journald fields: MESSAGE, MESSAGE_ID, PRIORITY and INGERO_* (upper-case names)."""
        out = {
            "MESSAGE": self.message(),
            "MESSAGE_ID": MESSAGE_IDS[self.type],
            "PRIORITY": str(_PRIORITY.get(self.type, 5)),
            "SYSLOG_IDENTIFIER": "ingero",
            "INGERO_EVENT": self.type,
        }
        for key, value in self.to_dict().items():
            if value is None or value == "" or key == "type":
                continue
            name = "INGERO_" + {"node_id": "NODE", "cluster_id": "CLUSTER", "job_id": "JOB"}.get(
                key, key.upper()
            )
            # Booleans and structures as JSON (true/false), so journalctl filters read naturally.
            out[name] = json.dumps(value) if isinstance(value, dict | list | bool) else str(value)
        return out

    def message(self) -> str:
        """One human line for logs and journalctl."""
        where = f"node {self.node_id}" + (f" job {self.job_id}" if self.job_id else "")
        if isinstance(self.extra.get("gpu"), int):
            where += f" GPU {self.extra['gpu']}"
        figures = ""
        if self.score is not None:
            figures += f" score={self.score:.3f}"
        if self.threshold is not None:
            figures += f" threshold={self.threshold:.3f}"
        if self.dominant_signal:
            figures += f" signal={self.dominant_signal}"
        reason = self.extra.get("reason")
        tail = f" ({reason})" if reason else ""
        if self.type == "stack_snapshot":
            return f"ingero {self.type}: {where}{_stack_words(self.extra)}"
        if self.type == "gpu_idle":
            return f"ingero {self.type}: {where}{_idle_words(self.extra)}"
        return f"ingero {self.type}: {where}{figures}{_nccl_words(self.extra)}{tail}"


_FIELD_NAMES = frozenset(f.name for f in fields(Event)) - {"extra"}
_ALL_FIELDS = tuple(f.name for f in fields(Event))


def _flat(base: dict[str, Any]) -> dict[str, Any]:
    """``base`` (every field of an Event, in order) with ``extra`` merged in at the end."""
    for key, value in base.pop("extra").items():
        base.setdefault(key, value)
    return base


_REQUIRED = frozenset(("type", "node_id", "cluster_id", "timestamp"))
_CANONICAL_UUID = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)


def _plain_json(extra: dict[str, Any]) -> bool:
    """True when every extra is a str key with a str/int/None value: JSON-safe as is, so
    the json.dumps check can be skipped (floats, containers and the rest still take it)."""
    for key, value in extra.items():
        if type(key) is not str or not (value is None or type(value) in (str, int, bool)):
            return False
    return True


def _nccl_words(extra: dict[str, Any]) -> str:
    """What a peer_lag or collective_hang says in its one line (Fleet's NCCL join)."""
    comm = extra.get("comm_hash")
    if not isinstance(comm, str):
        return ""
    state = extra.get("state")
    words = f" {state}" if isinstance(state, str) else ""
    if "lag_p50_ms" in extra:
        words += (
            f" comm {comm} rank {extra.get('comm_rank')}/{extra.get('nranks')}"
            f" {extra.get('op')} lag_p50_ms={extra.get('lag_p50_ms')}"
            f" lag_p95_ms={extra.get('lag_p95_ms')}"
            f" late={extra.get('late_count')}/{extra.get('collectives')}"
        )
    elif "missing_ranks" in extra:
        words += (
            f" comm {comm} {extra.get('op')} #{extra.get('seq')}"
            f" missing_ranks={json.dumps(extra.get('missing_ranks'))}"
            f" missing_nodes={json.dumps(extra.get('missing_nodes', []))}"
        )
        if "inside_for_s" in extra:
            words += f" inside_for_s={extra['inside_for_s']}"
        if "waiting_count" in extra:
            words += f" waiting_ranks={extra['waiting_count']}"
        if "waiting_for_s" in extra:
            words += f" waiting_for_s={extra['waiting_for_s']}"
    return words


def _idle_words(extra: dict[str, Any]) -> str:
    """What a gpu_idle says in its one line: which GPUs, whose, why and for how long."""
    words = f" {extra['state']}" if isinstance(extra.get("state"), str) else ""
    gpus = extra.get("gpus")
    if isinstance(gpus, list):
        words += " GPUs " + ",".join(str(g) for g in gpus)
    if isinstance(extra.get("user"), str):
        words += f" of {extra['user']}"
    if isinstance(extra.get("reason"), str):
        words += f" ({extra['reason']})"
    idle_s = extra.get("idle_s")
    if isinstance(idle_s, int | float) and not isinstance(idle_s, bool):
        words += f" idle for {idle_s:.0f} s"
    return words


def _stack_words(extra: dict[str, Any]) -> str:
    """What a stack_snapshot says in its one line: why it was taken, for how long the rank
    has been so, and where the first (most telling) thread of it is."""
    words = ""
    trigger = extra.get("trigger")
    if isinstance(trigger, str):
        words += f" {trigger}"
    if isinstance(extra.get("op"), str):
        words += f" in {extra['op']}"
        if isinstance(extra.get("seq"), int):
            words += f" #{extra['seq']}"
    for_s = extra.get("for_s")
    if isinstance(for_s, int | float) and not isinstance(for_s, bool):
        words += f" for {for_s:.0f} s"
    stacks = extra.get("stacks")
    first = stacks[0] if isinstance(stacks, list) and stacks else None
    if isinstance(first, dict):
        words += f": rank {first.get('rank')} pid {first.get('pid')}"
        try:
            words += f" in {stack_from_json(first).summary()}"
        except StackError as exc:
            words += f" ({exc})"
    return words


def snapshot_line(
    trigger: object,
    op: object,
    seq: object,
    rank: object,
    node_id: str,
    where: str,
    for_s: object,
) -> str:
    """A stack snapshot's answer in one line, as Echo and ``explain --job-nodes`` give it:
    "the job is hung in ncclAllReduce #9001; rank 5 on gpu07 has been in read_batch at
    loader.py:212 ← __next__ at loader.py:18 for 45 s"."""
    collective = op if isinstance(op, str) and op else "a collective"
    if trigger == "collective_hang":
        head = f"the job is hung in {collective}" + (f" #{seq}" if isinstance(seq, int) else "")
    elif trigger == "collective_wait":
        head = f"the job waits in {collective}" + (f" #{seq}" if isinstance(seq, int) else "")
    elif trigger == "peer_lag":
        head = f"rank {rank} enters {collective} late behind its peers"
    else:
        head = f"node {node_id} launches nothing while its job runs"
    lasted = (
        f" for {for_s:.0f} s"
        if isinstance(for_s, int | float) and not isinstance(for_s, bool)
        else ""
    )
    return f"{head}; rank {rank} on {node_id} has been in {where}{lasted}"
