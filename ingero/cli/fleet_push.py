"""``ingero fleet-push``: the per-node agent (unprivileged, Type=notify with watchdog)."""

from __future__ import annotations

import os
from typing import Any

import click

from ingero.cli.options import log_level_options, print_config_option, setup_logging
from ingero.cli.options import print_config as show_config
from ingero.push.config import DAEMON, PushConfig
from ingero.push.otel_env import otel_env_defaults
from ingero.runtime.config import load_config
from ingero.runtime.hangup import ignore_hangups


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
    # Imported here so `--help` and `--print-config` stay fast.
    from ingero.push.daemon import run_agent

    run_agent(config, job_id or None, rank, world_size, workload_type)
