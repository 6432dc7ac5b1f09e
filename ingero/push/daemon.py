"""fleet-push's daemon: the agent assembled from its configuration and run until a signal
stops it, as ``fleet/daemon.py`` and ``echo/daemon.py`` are for Fleet and Echo; the CLI
(``ingero.cli.fleet_push``) parses the options and calls :func:`run_agent`."""

from __future__ import annotations

import logging
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
from ingero.push.config import PushConfig, resolve_node_id
from ingero.push.detection_store import DetectionStore
from ingero.push.engines import EngineWatcher
from ingero.push.gpu_idle import GpuIdleDetector, HeldJob, held_jobs
from ingero.push.sampler import NodeSampler
from ingero.push.stack_snapshot import (
    Snapshotter,
    Target,
    ThreadStack,
    dump,
    find_py_spy,
    job_targets,
)
from ingero.runtime.clock import SystemClock
from ingero.runtime.signals import stop_on_signals
from ingero.runtime.systemd import notifier
from ingero.schema.events import Event
from ingero.slurm.jobcgroup import job_cgroups
from ingero.slurm.jobfile import current_jobs, jobs_dir


def _snapshotter(
    config: PushConfig,
    pid_alive: Callable[[int], bool],
    emit: Callable[[Event], None],
    clock: SystemClock,
) -> Snapshotter:
    """The stack snapshot of the job's processes, from the node DB's processes table."""
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
    """Assemble the agent from its configuration (the GPU query, the engines, the sampler, the
    client, the channels, the detection store, the snapshotter, the gpu_idle detector) and
    run it until a signal stops it."""
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
