"""``ingero fleet-push`` configuration (``/etc/ingero/fleet-push.yaml``); defaults live here."""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ingero import nodedb
from ingero.otlp.ports import FLEET_OTLP_HTTP_PORT
from ingero.otlp.threshold import (
    ENTER_INTERVALS,
    ENTER_WINDOW,
    EXIT_INTERVALS,
    MAX_ENTER_WINDOW,
    MAX_EXIT_INTERVALS,
)
from ingero.push.score import ScoreConfig
from ingero.runtime.config import Duration, check, formerly, in_range, positive
from ingero.runtime.systemd import JOURNAL_SOCKET
from ingero.schema.events import EVENT_SOCKET
from ingero.schema.healthstate import STATE_PATH
from ingero.slurm.jobcgroup import CGROUP_ROOT
from ingero.slurm.jobfile import JOBS_DIR, JOBS_DIR_ENV

DAEMON = "fleet-push"


@dataclass(frozen=True)
class DetectionConfig:
    """Age limits that pick the detection mode (see ``ingero.push.detection``)."""

    # fleet: the last threshold Fleet sent (with quorum) is at most this old.
    fleet_max_age: Duration = field(default=Duration(15.0), metadata=positive())
    # fleet-cached: Fleet's last threshold, kept in memory, is at most this old.
    fleet_cached_max_age: Duration = field(default=Duration(300.0), metadata=positive())
    # local-cached: the threshold persisted in state_dir (survives restarts) is at most this old.
    local_cached_max_age: Duration = field(default=Duration(3600.0), metadata=positive())
    # local-baseline: straggler when the score drops this far below its own EMA.
    local_margin: float = field(default=0.1, metadata=in_range(0.01, 1.0))
    local_ema_alpha: float = field(
        default=0.1, metadata=check(lambda v: 0 < v <= 1, "must be in (0, 1]")
    )
    local_warmup: int = field(default=6, metadata=positive())

    def validate(self) -> None:
        if not self.fleet_max_age <= self.fleet_cached_max_age <= self.local_cached_max_age:
            raise ValueError(
                "detection: need fleet_max_age <= fleet_cached_max_age <= local_cached_max_age"
            )


@dataclass(frozen=True)
class ClassifierConfig:
    # A straggler recovers only at threshold + hysteresis, so a node on the edge does not flap.
    hysteresis: float = field(default=0.02, metadata=in_range(0.0, 1.0))
    # Intervals below the threshold before an episode starts: one noisy sample among
    # thousands of node-intervals an hour must not page anyone...
    enter_intervals: int = field(default=ENTER_INTERVALS, metadata=in_range(1, MAX_ENTER_WINDOW))
    # ... within the last this many classified intervals (at most enter_intervals: in a row).
    enter_window: int = field(default=ENTER_WINDOW, metadata=in_range(1, MAX_ENTER_WINDOW))
    # An episode recovers once the score was at threshold + hysteresis or above in this many
    # classified intervals in a row: one noisy interval above does not end it.
    exit_intervals: int = field(default=EXIT_INTERVALS, metadata=in_range(1, MAX_EXIT_INTERVALS))
    # While a straggler, straggler_state is re-sent every N intervals (0: only on entry).
    reemit_intervals: int = field(default=12, metadata=check(lambda v: v >= 0, "must be >= 0"))


@dataclass(frozen=True)
class ChannelsConfig:
    journald: bool = True
    journal_socket: str = JOURNAL_SOCKET
    uds: bool = True
    event_socket: str = EVENT_SOCKET
    otlp_logs: bool = True
    queue_size: int = field(default=1000, metadata=positive())


@dataclass(frozen=True)
class NcclConfig:
    """What of the node DB's NCCL tables goes with each push (``nccl:``, as Fleet's section
    of what it does with them; ``collectives:`` is its earlier name)."""

    enabled: bool = True
    # A communicator is pushed while the tracer wrote a row for it within this many push
    # intervals (a process that exited, or a communicator destroyed, drops out after them).
    recent_intervals: int = field(default=3, metadata=positive())
    # At most this many sampled calls are read from the node DB per push (the newest), so
    # a burst of collectives costs a bounded read; the encoder keeps at most 1,024 of them.
    max_calls_read: int = field(default=16384, metadata=positive())


@dataclass(frozen=True)
class ClockConfig:
    """The clock offset to Fleet, estimated from push round trips."""

    # The estimate is the best (shortest round trip) of the last this many replies that
    # carried Fleet's time.
    samples: int = field(default=8, metadata=positive())
    # clock_skew starts when the offset is beyond this bound by more than its uncertainty.
    skew_bound: Duration = field(default=Duration(0.010), metadata=positive())


@dataclass(frozen=True)
class SnapshotConfig:
    """The stack snapshot of the job's processes (``stack_snapshot``), taken once per
    episode when the node is stalled or Fleet names one of its ranks in a collective_hang
    or peer_lag episode (docs/fleet-push.md, "Stack snapshots")."""

    enabled: bool = True
    # The py-spy executable: a path, or a name looked up on PATH, then beside the Python
    # fleet-push runs on (the wheel puts it in the venv's bin).
    py_spy: str = "py-spy"
    # Add C frames (py-spy --native); it pauses each process for the dump (--nonblocking
    # reads Python frames without stopping it, and cannot be combined with --native).
    native: bool = False
    # One process's dump; py-spy is killed past it, and the whole snapshot stops after
    # ``max_processes`` times it.
    timeout: Duration = field(default=Duration(2.0), metadata=positive())
    # py-spy output read per process (bytes); more is a reason, not a stack.
    max_output: int = field(default=1 << 20, metadata=positive())
    max_processes: int = field(default=8, metadata=positive())
    # Frames kept per thread (innermost), at most ingero.schema.stacks.MAX_FRAMES.
    max_frames: int = field(default=64, metadata=in_range(1, 128))
    # Stacks JSON per event: the event must stay within one OTLP log record (16 KiB).
    max_bytes: int = field(default=10_000, metadata=in_range(1000, 12_000))
    # At most one snapshot per this long (a later episode waits for its turn).
    min_gap: Duration = field(default=Duration(10.0), metadata=positive())


@dataclass(frozen=True)
class InferenceConfig:
    """The node's inference servers (vLLM, SGLang, TGI, Triton, TensorRT-LLM): recognised
    from /proc, recorded in the node DB, measured from their Prometheus /metrics."""

    enabled: bool = True
    # Where process command lines are read (a container's host /proc may be mounted elsewhere).
    proc_root: str = "/proc"
    # One server's /metrics read, whole: a hanging endpoint costs at most this per push.
    metrics_timeout: Duration = field(default=Duration(1.0), metadata=positive())
    # A /metrics text larger than this is refused, not parsed (real ones are tens of KiB).
    max_metrics_bytes: int = field(default=4 * 1024 * 1024, metadata=in_range(1024, 1 << 30))


@dataclass(frozen=True)
class GpuIdleConfig:
    """GPUs a Slurm job holds and does not use: the ``gpu_idle`` episodes
    (``ingero.push.gpu_idle``)."""

    enabled: bool = True
    # A held GPU without use this long starts an episode.
    idle_after: Duration = field(default=Duration(1800.0), metadata=positive())
    # NVML's 0%: a GPU busy less than this share of a window did nothing in it.
    busy_below: float = field(default=0.01, metadata=in_range(0.0001, 1.0))
    # Where Slurm's job cgroups are read (an empty one is an ended job's: it holds no GPU).
    cgroup_root: str = str(CGROUP_ROOT)


@dataclass(frozen=True)
class PushConfig:
    # One endpoint, or several (a list, or one string with commas) to fail over between
    # where no balancer is in front of Fleet's replicas (ingero.otlp.exporter.Failover).
    fleet_endpoint: str | list[str] = f"http://127.0.0.1:{FLEET_OTLP_HTTP_PORT}"
    transport: Literal["http", "grpc"] = "http"
    # Fleet's threshold API, polled only when a push response carries no threshold headers.
    api_endpoint: str | None = None
    push_interval: Duration = field(default=Duration(5.0), metadata=positive())
    # None: half the push interval, so a slow Fleet never costs a whole interval.
    timeout: Duration | None = field(default=None, metadata=positive())
    jitter: float = field(default=0.1, metadata=in_range(0.0, 0.5))
    # Sent with every OTLP request (names lower case), e.g. a collector's API key.
    headers: dict[str, str] = field(default_factory=dict)
    compression: Literal["none", "gzip"] = "none"
    node_id: str | None = None
    cluster_id: str = "default"
    host_name: str | None = None
    # The inference service this node's replica serves: nodes without a Slurm job are
    # compared with the other replicas of it (None: the one model the node's servers
    # serve, else the workload type).
    service: str | None = None
    node_db: str = nodedb.DEFAULT_PATH
    state_dir: str = "/var/lib/ingero/state"
    # The node's health state file, rewritten after every iteration for local readers
    # (``ingero check --health``, NHC's check_ingero); null: not written.
    health_state: str | None = STATE_PATH
    auth_token_file: str | None = None
    ca_file: str | None = None
    detection: DetectionConfig = field(default_factory=DetectionConfig)
    classifier: ClassifierConfig = field(default_factory=ClassifierConfig)
    channels: ChannelsConfig = field(default_factory=ChannelsConfig)
    nccl: NcclConfig = field(default_factory=NcclConfig, metadata=formerly("collectives"))
    clock: ClockConfig = field(default_factory=ClockConfig)
    snapshot: SnapshotConfig = field(default_factory=SnapshotConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    gpu_idle: GpuIdleConfig = field(default_factory=GpuIdleConfig)
    score: ScoreConfig = field(default_factory=ScoreConfig)

    def validate(self) -> None:
        if not self.fleet_endpoints:
            raise ValueError("fleet_endpoint: no endpoint given")
        for endpoint in self.fleet_endpoints:
            if self.transport == "http" and not endpoint.startswith(("http://", "https://")):
                raise ValueError(
                    f"fleet_endpoint must start with http:// or https://, got {endpoint!r}"
                )
        if self.timeout is not None and self.timeout >= self.push_interval:
            raise ValueError("timeout must be shorter than push_interval")

    @property
    def fleet_endpoints(self) -> list[str]:
        """Every configured endpoint, in failover order (a string may list several,
        comma-separated, as ``--endpoint a,b`` does)."""
        given = (
            [self.fleet_endpoint] if isinstance(self.fleet_endpoint, str) else self.fleet_endpoint
        )
        return [e.strip() for item in given for e in item.split(",") if e.strip()]

    @property
    def push_timeout(self) -> float:
        return float(self.timeout) if self.timeout is not None else self.push_interval / 2


def resolve_node_id(
    configured: str | None,
    environ: dict[str, str] | None = None,
    jobs_dir: Path = JOBS_DIR,
) -> str:
    """The node's name: configured, else Slurm's NodeName (job file, $SLURMD_NODENAME), else host."""
    if configured:
        return configured
    env = os.environ if environ is None else environ
    from_job = _node_name_from_jobs(Path(env.get(JOBS_DIR_ENV) or jobs_dir))
    if from_job:
        return from_job
    if env.get("SLURMD_NODENAME"):
        return env["SLURMD_NODENAME"]
    return socket.gethostname()


def _node_name_from_jobs(jobs_dir: Path) -> str | None:
    """The prolog writes one JSON file per job; any of them names this node."""
    try:
        files = sorted(jobs_dir.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return None
    for path in files:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        name = (data.get("node_name") or data.get("node_id")) if isinstance(data, dict) else None
        if isinstance(name, str) and name:
            return name
    return None
