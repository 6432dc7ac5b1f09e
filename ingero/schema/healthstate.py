"""The node's health state file: what fleet-push knows of this node, for local readers.

fleet-push (the owner: nothing else writes it, ``ingero.push.agent``) replaces ``STATE_PATH``
atomically (temporary file + rename, mode 0644) after every iteration, so ``ingero check --health`` and NHC's
``check_ingero`` learn of the node's open straggler episode and its idle GPUs with one file
read: no call to Fleet, Slurm or anything beyond the node. The default lives in systemd's
``RuntimeDirectory`` of fleet-push (``/run/ingero/push``), which is removed when fleet-push
stops, so a stopped agent leaves no claim behind; a reader also treats a file not rewritten
for ``FRESH_INTERVALS`` push intervals (at least ``FRESH_MIN_S``) as stale.

The file is one JSON object (``encode``/``decode``, encoder beside decoder): ``version``,
``node_id``, ``cluster_id``, ``written_at`` (Unix s), ``interval_s`` (fleet-push's push
interval), ``state`` (the node state), ``mode`` (the detection mode, or null),
``straggler`` (null, or the open episode: ``episode_id``, ``since`` (Unix s, when it opened
here), ``job_id``, ``reason`` (``score`` | ``stall`` | ``peer_lag``), ``score``,
``threshold``, ``dominant_signal``) and ``gpu_idle`` (the open ``gpu_idle`` episodes:
``event_id``, ``job_id``, ``gpus``, ``since``, ``reason``). Later versions only add keys; a
reader ignores the ones it does not know.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

STATE_PATH: Final = "/run/ingero/push/health.json"
FORMAT_VERSION: Final = 1
# A file larger than this is not a state file fleet-push wrote (it is a few hundred bytes).
MAX_BYTES: Final = 256 * 1024
# Fresh while rewritten within this many push intervals, and never less than this long.
FRESH_INTERVALS: Final = 3
FRESH_MIN_S: Final = 30.0
STRAGGLER_REASONS: Final = ("score", "stall", "peer_lag")
IDLE_REASONS: Final = ("no_process", "zero_busy")
_MAX_IDLE: Final = 1024


class StateError(ValueError):
    """The state file is not one fleet-push wrote: the message names what is wrong."""


@dataclass(frozen=True)
class Straggler:
    """The node's open straggler episode, as fleet-push classified it."""

    episode_id: str
    since: float  # Unix s, when the episode opened on this node
    reason: str  # score | stall | peer_lag
    job_id: str | None = None
    score: float | None = None
    threshold: float | None = None
    dominant_signal: str | None = None


@dataclass(frozen=True)
class IdleGpus:
    """An open ``gpu_idle`` episode: a job's GPUs held and unused since ``since``."""

    event_id: str
    job_id: str
    gpus: tuple[int, ...]
    since: float
    reason: str  # no_process | zero_busy


@dataclass(frozen=True)
class HealthState:
    node_id: str
    cluster_id: str
    written_at: float
    interval_s: float
    state: str
    mode: str | None = None
    straggler: Straggler | None = None
    gpu_idle: tuple[IdleGpus, ...] = field(default=())
    version: int = FORMAT_VERSION

    def fresh(self, now: float) -> bool:
        """Whether the file was rewritten recently enough to speak for the node now."""
        return now - self.written_at <= max(FRESH_MIN_S, FRESH_INTERVALS * self.interval_s)


def encode(state: HealthState) -> bytes:
    data = asdict(state)
    data["gpu_idle"] = [{**g, "gpus": list(g["gpus"])} for g in data["gpu_idle"]]
    return json.dumps(data, separators=(",", ":"), allow_nan=False).encode()


def _get(data: dict[str, Any], key: str, kinds: tuple[type, ...], optional: bool) -> Any:
    value = data.get(key)
    if value is None:
        if optional:
            return None
        raise StateError(f"health state field {key} is missing")
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise StateError(f"health state field {key} has the wrong type")
    if isinstance(value, float) and not math.isfinite(value):
        raise StateError(f"health state field {key} must be finite")
    return value


def _text(data: dict[str, Any], key: str, optional: bool = False) -> Any:
    value = _get(data, key, (str,), optional)
    if value is not None and (not value or len(value) > 256):
        raise StateError(f"health state field {key} must hold 1 to 256 characters")
    return value


def _number(data: dict[str, Any], key: str, optional: bool = False) -> float | None:
    value = _get(data, key, (int, float), optional)
    return None if value is None else float(value)


def _object(data: Any, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise StateError(f"health state {what} must be a JSON object")
    return data


def _episode(d: dict[str, Any], what: str, reasons: tuple[str, ...]) -> tuple[str, float]:
    """An episode's ``reason`` (one of ``reasons``) and ``since``."""
    reason = _text(d, "reason")
    if reason not in reasons:
        raise StateError(
            f"health state {what} reason {reason!r} is not one of {', '.join(reasons)}"
        )
    since = _number(d, "since")
    assert since is not None
    return reason, since


def _straggler(data: Any) -> Straggler | None:
    if data is None:
        return None
    d = _object(data, "field straggler")
    reason, since = _episode(d, "straggler", STRAGGLER_REASONS)
    return Straggler(
        episode_id=_text(d, "episode_id"),
        since=since,
        reason=reason,
        job_id=_text(d, "job_id", optional=True),
        score=_number(d, "score", optional=True),
        threshold=_number(d, "threshold", optional=True),
        dominant_signal=_text(d, "dominant_signal", optional=True),
    )


def _idle(data: Any) -> IdleGpus:
    d = _object(data, "gpu_idle entry")
    gpus = d.get("gpus")
    if not isinstance(gpus, list) or not all(type(g) is int and 0 <= g < 1 << 16 for g in gpus):
        raise StateError("health state gpu_idle gpus must be a list of GPU indices")
    reason, since = _episode(d, "gpu_idle", IDLE_REASONS)
    return IdleGpus(_text(d, "event_id"), _text(d, "job_id"), tuple(gpus), since, reason)


def decode(data: bytes) -> HealthState:
    """Parse a state file's bytes; StateError names the first thing that is wrong."""
    if len(data) > MAX_BYTES:
        raise StateError(f"health state is {len(data)} bytes, more than {MAX_BYTES}")
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise StateError(f"health state is not JSON: {exc}") from None
    d = _object(raw, "file")
    version = _get(d, "version", (int,), False)
    if version < 1:
        raise StateError(f"health state version {version} is not a version")
    interval = _number(d, "interval_s")
    written = _number(d, "written_at")
    assert interval is not None and written is not None
    if interval <= 0:
        raise StateError("health state field interval_s must be > 0")
    idle = d.get("gpu_idle", [])
    if not isinstance(idle, list) or len(idle) > _MAX_IDLE:
        raise StateError(f"health state gpu_idle must be a list of at most {_MAX_IDLE}")
    return HealthState(
        node_id=_text(d, "node_id"),
        cluster_id=_text(d, "cluster_id"),
        written_at=written,
        interval_s=interval,
        state=_text(d, "state"),
        mode=_text(d, "mode", optional=True),
        straggler=_straggler(d.get("straggler")),
        gpu_idle=tuple(_idle(g) for g in idle),
        version=version,
    )


def read(path: Path) -> HealthState | None:
    """The state file, or None when there is none; StateError when it is not one."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(f"{path}: {exc.strerror}") from None
    try:
        return decode(data)
    except StateError as exc:
        raise StateError(f"{path}: {exc}") from None
