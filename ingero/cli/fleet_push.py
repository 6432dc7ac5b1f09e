"""``ingero fleet-push``: the per-node agent (unprivileged, Type=notify with watchdog)."""

from __future__ import annotations

import logging
import os
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ingero.cli.options import log_level_options, print_config_option, setup_logging
from ingero.cli.options import print_config as show_config
from ingero.push.config import DAEMON, PushConfig, resolve_node_id
from ingero.push.otel_env import otel_env_defaults
from ingero.runtime.clock import SystemClock
from ingero.runtime.config import load_config
from ingero.runtime.hangup import ignore_hangups
from ingero.runtime.signals import stop_on_signals

if TYPE_CHECKING:  # imported where used, so `--help` stays fast
    from ingero.push.stack_snapshot import Snapshotter, ThreadStack
    from ingero.schema.events import Event


@click.command("fleet-push")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="YAML config file.")
@click.option(
    "--endpoint",
    multiple=True,
    help="Fleet OTLP endpoint (fleet_endpoint); repeat it, or separate with commas, to fail "
    "over between Fleet replicas.",
)
@click.option("--api-endpoint", help="Fleet threshold API base URL (api_endpoint).")
@click.option("--transport", type=click.Choice(["http", "grpc"]), help="OTLP transport.")
@click.option("--node-id", help="This node's name (default: Slurm NodeName, else host name).")
@click.option("--cluster-id", help="Cluster name (Slurm ClusterName).")
@click.option("--node-db", help="Node DB path written by ingero trace.")
@click.option("--state-dir", help="Where baselines and the cached threshold persist.")
@click.option("--health-state", help="The node's health state file (health_state; '' for none).")
@click.option("--event-socket", help="Unix socket that receives NDJSON events.")
@click.option("--journal-socket", help="journald native socket path.")
@click.option("--push-interval", help="Push cadence, e.g. 5s.")
@click.option("--job-id", default=lambda: os.environ.get("SLURM_JOB_ID"), help="Slurm job id.")
@click.option("--rank", type=int, help="This node's rank in the job.")
@click.option("--world-size", type=int, help="Number of ranks in the job.")
@click.option("--workload-type", help="Peer group for nodes without a job (e.g. training).")
@click.option(
    "--service",
    default=lambda: os.environ.get("INGERO_SERVICE"),
    help="Inference service this node's replica serves (peer group without a job).",
)
@print_config_option
@log_level_options
def command(
    config_path: str | None,
    endpoint: tuple[str, ...],
    api_endpoint: str | None,
    transport: str | None,
    node_id: str | None,
    cluster_id: str | None,
    node_db: str | None,
    state_dir: str | None,
    health_state: str | None,
    event_socket: str | None,
    journal_socket: str | None,
    push_interval: str | None,
    job_id: str | None,
    rank: int | None,
    world_size: int | None,
    workload_type: str | None,
    service: str | None,
    print_config: bool,
    log_level: str,
    verbose: bool,
) -> None:
    """Push this node's health score to Fleet and report when it straggles."""
    # First: a SIGHUP from here on is a log line, not the end of the node's pusher.
    ignore_hangups(
        "fleet-push", "the token file is re-read when it changes; restart to reconfigure"
    )
    overrides: dict[str, Any] = {
        # One flag stays a string (as in the file); several are the failover list.
        "fleet_endpoint": (endpoint[0] if len(endpoint) == 1 else list(endpoint)) or None,
        "api_endpoint": api_endpoint,
        "transport": transport,
        "node_id": node_id,
        "cluster_id": cluster_id,
        "node_db": node_db,
        "state_dir": state_dir,
        "health_state": health_state,
        "channels.event_socket": event_socket,
        "channels.journal_socket": journal_socket,
        "push_interval": push_interval,
        "service": service or None,
    }
    config = load_config(
        PushConfig,
        DAEMON,
        config_path,
        overrides,
        flags={"fleet_endpoint": "--endpoint"},
        env_defaults=otel_env_defaults(os.environ),
    )
    if print_config:
        show_config(config)
        return
    setup_logging(log_level, verbose, "%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_agent(config, job_id or None, rank, world_size, workload_type)


def _snapshotter(
    config: PushConfig,
    pid_alive: Callable[[int], bool],
    emit: Callable[[Event], None],
    clock: SystemClock,
) -> Snapshotter:
    """The stack snapshot of the job's processes, from the node DB's processes table."""
    from ingero.push.stack_snapshot import Snapshotter, Target, dump, find_py_spy, job_targets

    cfg = config.snapshot
    py_spy = find_py_spy(cfg.py_spy)
    if py_spy is None:
        logging.getLogger(__name__).warning(
            "py-spy not found (%s): stack snapshots will say so, with no frames", cfg.py_spy
        )

    def dumper(target: Target, timeout_s: float) -> list[ThreadStack]:
        return dump(
            target,
            py_spy=py_spy,
            timeout_s=timeout_s,
            max_output=cfg.max_output,
            max_frames=cfg.max_frames,
            native=cfg.native,
        )

    return Snapshotter(
        targets=lambda job: job_targets(
            Path(config.node_db), job, limit=cfg.max_processes, pid_alive=pid_alive
        ),
        dumper=dumper,
        emit=emit,
        clock=clock,
        min_gap_s=float(cfg.min_gap),
        keep=Path(config.node_db),
        timeout_s=float(cfg.timeout),
        max_processes=cfg.max_processes,
        max_bytes=cfg.max_bytes,
    )


def _gpu_idle(config: PushConfig) -> dict[str, Any]:
    """The gpu_idle detector and where it learns which jobs hold which GPUs: the prolog's
    job files, less the jobs whose Slurm cgroup is there and empty (ended)."""
    from ingero.push.gpu_idle import GpuIdleDetector, HeldJob, held_jobs
    from ingero.slurm.jobcgroup import job_cgroups
    from ingero.slurm.jobfile import current_jobs, jobs_dir

    cfg = config.gpu_idle
    if not cfg.enabled:
        return {}
    root = Path(cfg.cgroup_root)

    def held() -> list[HeldJob]:
        return held_jobs(current_jobs(jobs_dir()), job_cgroups(root))

    return {
        "gpu_idle": GpuIdleDetector(float(cfg.idle_after), cfg.busy_below),
        "held_jobs": held,
    }


def run_agent(
    config: PushConfig,
    job_id: str | None,
    rank: int | None,
    world_size: int | None,
    workload_type: str | None,
) -> None:
    # Imported here so `--help` and `--print-config` stay fast.
    from ingero.collectors.gpu import FallbackQuery, GpuQuery, NvidiaSmi
    from ingero.collectors.nvml import NvmlQuery
    from ingero.otlp.health import ATTR_CLUSTER_ID, ATTR_HOST_NAME, ATTR_NODE_ID
    from ingero.otlp.resource import PUSH_SERVICE, service_attributes
    from ingero.push.agent import Agent, Identity
    from ingero.push.channels import Channel
    from ingero.push.channels.journald import JournaldChannel
    from ingero.push.channels.otlp import OtlpLogsChannel
    from ingero.push.channels.uds import UdsChannel
    from ingero.push.client import make_client
    from ingero.push.detection_store import DetectionStore
    from ingero.push.engines import EngineWatcher
    from ingero.push.sampler import NodeSampler
    from ingero.runtime.systemd import notifier
    from ingero.slurm.jobfile import current_jobs, jobs_dir

    clock = SystemClock()
    node = resolve_node_id(config.node_id)
    host = config.host_name or socket.gethostname()
    ident = Identity(
        node, config.cluster_id, host, job_id, rank, world_size, workload_type, config.service
    )
    state_dir = Path(config.state_dir)
    # Used only where the node DB holds no GPU rows (no ingero trace or gpu-sample here).
    queries: list[GpuQuery] = [NvmlQuery()]
    if shutil.which("nvidia-smi"):
        queries.append(NvidiaSmi())
    gpu: GpuQuery = FallbackQuery(*queries)
    inference = config.inference
    engines = (
        EngineWatcher(
            db_path=Path(config.node_db),
            clock=clock,
            service=config.service,
            proc_root=Path(inference.proc_root),
            timeout_s=float(inference.metrics_timeout),
            max_bytes=inference.max_metrics_bytes,
        )
        if inference.enabled
        else None
    )
    sampler = NodeSampler(
        node_id=node,
        db_path=Path(config.node_db),
        config=config.score,
        window_s=float(config.push_interval),
        clock=clock,
        baseline_path=state_dir / "baselines.json",
        gpu=gpu,
        collectives=config.nccl,
        engines=engines,
    )
    client = make_client(config)
    ch = config.channels
    channels: list[Channel] = []
    if ch.journald:
        channels.append(JournaldChannel(ch.journal_socket))
    if ch.uds:
        channels.append(UdsChannel(ch.event_socket, ch.queue_size))
    if ch.otlp_logs:
        resource = {
            **service_attributes(PUSH_SERVICE, node),
            ATTR_NODE_ID: node,
            ATTR_CLUSTER_ID: config.cluster_id,
            ATTR_HOST_NAME: host,
        }
        channels.append(OtlpLogsChannel(client.export_logs, resource, ch.queue_size))
    store = DetectionStore(state_dir / "detection.json", node, clock)
    # An explicit --job-id pins the peer group; otherwise the prolog's job files say.
    job_source = None if job_id else lambda: next(iter(current_jobs(jobs_dir())), None)
    agent = Agent(
        config,
        ident,
        sampler,
        client,
        channels,
        clock,
        store,
        job_source=job_source,
        engines=engines,
        health_state=Path(config.health_state) if config.health_state else None,
        **_gpu_idle(config),
    )
    if config.snapshot.enabled:
        agent.snapshotter = _snapshotter(config, sampler.pid_alive, agent.emit, clock)

    stop, stop_signals = stop_on_signals()
    logging.getLogger(__name__).info(
        "fleet-push %s/%s -> %s every %ss",
        config.cluster_id,
        node,
        config.fleet_endpoint,
        float(config.push_interval),
    )
    try:
        agent.run(stop, notifier())
    finally:
        if stop_signals.received is not None:
            logging.getLogger(__name__).info("signal %d: stopping", stop_signals.received)
        agent.close()
        stats = {c.name: c.stats() for c in channels}
        logging.getLogger(__name__).info("stopped; channels %s", stats)
