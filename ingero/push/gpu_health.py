"""GPU hardware health: a factor on the score and the events ``gpu_throttle``, ``gpu_xid``,
``gpu_ecc`` (pure; state across windows, time from the caller).

Per GPU and window (``GpuWindow`` from the node DB):

- a lost GPU (NVML ``GPU_IS_LOST``) has health 0;
- an XID, new uncorrected ECC errors (or uncorrectable remapped rows, or retired pages), and a
  pending or failed row remapping / page retirement give ``1 - error_penalty``; an XID or new
  ECC errors keep doing so for ``error_hold`` after they were seen (the pending/failed flags
  stay in every row until the GPU is reset);
- a hardware slowdown (``DEGRADING_THROTTLE`` reasons) for a share ``f`` of the window's
  samples gives ``1 - throttle_penalty * f``.

The node's health is its worst GPU's. No GPU reporting health: None (missing, not 1).

Events, one schema with every other (``ingero.schema.events``), ``extra.gpu`` naming the GPU:
``gpu_xid`` once per XID seen (or the GPU lost); ``gpu_ecc`` when an error counter grows or a
pending/failed flag appears; ``gpu_throttle`` when a GPU's hardware slows it for at least half
a window (``state: start``) and again when a window has none (``state: end``, same event_id).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ingero.collectors.nvml import DEGRADING_THROTTLE, throttle_names
from ingero.nodedb.window import GpuWindow
from ingero.push.score import GpuHealthConfig
from ingero.schema.events import Event, new_event_id

THROTTLE_START: Final = 0.5  # share of a window's samples
ERROR_COUNTERS: Final = ("ecc_uncorrected", "remapped_rows_uncorrectable", "retired_pages")
ERROR_FLAGS: Final = ("remap_failure", "remap_pending", "retired_pages_pending")


@dataclass(frozen=True)
class GpuFinding:
    """A new GPU problem (or the end of one), to be emitted as an event."""

    type: str  # gpu_throttle | gpu_xid | gpu_ecc
    gpu: int
    event_id: str
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GpuHealth:
    value: float | None  # worst GPU's factor; None when no GPU reported on its health
    per_gpu: Mapping[int, float]
    findings: tuple[GpuFinding, ...] = ()


@dataclass
class _GpuState:
    last_error_at: float | None = None
    last_xid_ts: float = float("-inf")
    counters: dict[str, int] = field(default_factory=dict)  # last values reported on
    flags: set[str] = field(default_factory=set)
    throttle_episode: str | None = None
    lost: bool = False


class GpuHealthTracker:
    def __init__(self, config: GpuHealthConfig) -> None:
        self.config = config
        self._state: dict[int, _GpuState] = {}

    def observe(self, gpus: Mapping[int, GpuWindow], now: float) -> GpuHealth:
        per_gpu: dict[int, float] = {}
        findings: list[GpuFinding] = []
        for index, g in sorted(gpus.items()):
            if not g.health_measured:
                continue
            state = self._state.setdefault(index, _GpuState())
            findings += self._findings(g, state, now)
            per_gpu[index] = self._factor(g, state, now)
        value = min(per_gpu.values()) if per_gpu else None
        return GpuHealth(value, per_gpu, tuple(findings))

    def _factor(self, g: GpuWindow, state: _GpuState, now: float) -> float:
        cfg = self.config
        if g.lost:
            return 0.0
        factor = 1.0
        held = state.last_error_at is not None and now - state.last_error_at <= cfg.error_hold
        if held or any(getattr(g, flag) for flag in ERROR_FLAGS):
            factor = 1.0 - cfg.error_penalty
        throttled = g.throttled_fraction or 0.0
        return min(factor, 1.0 - cfg.throttle_penalty * throttled)

    def _findings(self, g: GpuWindow, state: _GpuState, now: float) -> list[GpuFinding]:
        out: list[GpuFinding] = []
        gpu = g.gpu
        if g.lost and not state.lost:
            out.append(
                GpuFinding(
                    "gpu_xid",
                    gpu,
                    new_event_id(),
                    {"lost": True, "xids": [], "reason": "GPU is lost"},
                )
            )
        state.lost = g.lost
        fresh = [x for ts, x in g.xids if ts > state.last_xid_ts]
        if g.xids:
            state.last_xid_ts = max(state.last_xid_ts, max(ts for ts, _ in g.xids))
        if fresh:
            state.last_error_at = now
            detail = "XID " + ", ".join(str(x) for x in fresh)
            out.append(
                GpuFinding("gpu_xid", gpu, new_event_id(), {"xids": fresh, "reason": detail})
            )
        grown: dict[str, int] = {}
        for name in ERROR_COUNTERS:
            if name not in g.counters:
                continue
            latest = g.counters[name]
            # First sight: count from where the window's growth started.
            seen = state.counters.get(name, latest - g.new.get(name, 0))
            if latest > seen:
                grown[f"{name}_new"] = latest - seen
            state.counters[name] = latest
        flags = {name for name in ERROR_FLAGS if getattr(g, name)}
        appeared = flags - state.flags
        state.flags = flags
        if grown:
            state.last_error_at = now
        if grown or appeared:
            extra: dict[str, Any] = dict(grown)
            extra.update({name: True for name in sorted(flags)})
            if "ecc_uncorrected" in g.counters:
                extra["ecc_uncorrected"] = g.counters["ecc_uncorrected"]
            extra["reason"] = ", ".join(
                [f"{n} {k.removesuffix('_new').replace('_', ' ')}" for k, n in grown.items()]
                + [k.replace("_", " ") for k in sorted(appeared)]
            )
            out.append(GpuFinding("gpu_ecc", gpu, new_event_id(), extra))
        out += self._throttle(g, state)
        return out

    def _throttle(self, g: GpuWindow, state: _GpuState) -> list[GpuFinding]:
        share = g.throttled_fraction
        if share is None:
            return []
        reasons = throttle_names(g.throttle_reasons & DEGRADING_THROTTLE)
        details = {
            "throttled_fraction": round(share, 3),
            "reasons": reasons,
            "reason": f"{', '.join(reasons) or 'no hardware slowdown'}, {share:.0%} of the window",
            "sm_clock_mhz": None if g.sm_clock_mhz is None else round(g.sm_clock_mhz),
            "sm_clock_max_mhz": g.sm_clock_max_mhz,
        }
        if state.throttle_episode is None and share >= THROTTLE_START:
            state.throttle_episode = new_event_id()
            return [
                GpuFinding(
                    "gpu_throttle", g.gpu, state.throttle_episode, {"state": "start", **details}
                )
            ]
        if state.throttle_episode is not None and share == 0.0:
            episode, state.throttle_episode = state.throttle_episode, None
            return [GpuFinding("gpu_throttle", g.gpu, episode, {"state": "end", **details})]
        return []


def gpu_events(
    findings: tuple[GpuFinding, ...],
    *,
    node_id: str,
    cluster_id: str,
    timestamp: float,
    job_id: str | None = None,
    rank: int | None = None,
    score: float | None = None,
) -> list[Event]:
    """The findings as events of the common schema (``extra.gpu`` names the GPU)."""
    return [
        Event(
            type=f.type,
            node_id=node_id,
            cluster_id=cluster_id,
            timestamp=timestamp,
            event_id=f.event_id,
            job_id=job_id,
            rank=rank,
            score=score,
            dominant_signal="gpu_health",
            extra={"gpu": f.gpu, **f.extra},
        )
        for f in findings
    ]
