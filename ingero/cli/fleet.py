"""``ingero fleet``: the central peer-relative threshold daemon."""

from __future__ import annotations

import click

from ingero.cli.options import log_level_options, print_config_option, setup_logging
from ingero.cli.options import print_config as show_config
from ingero.runtime.errors import UnavailableError, UsageError
from ingero.runtime.hangup import StartupHangups


@click.command("fleet")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="YAML file.")
@click.option("--otlp-grpc", help="HOST:PORT of the OTLP/gRPC receiver (port 0: any free).")
@click.option("--otlp-http", help="HOST:PORT of the OTLP/HTTP receiver (port 0: any free).")
@click.option("--api", help="HOST:PORT of the threshold API and /metrics (port 0: any free).")
@click.option("--push-interval", help="Expected agent cadence and tick period, e.g. 5s.")
@click.option("--ttl-multiplier", type=float, help="Nodes expire after push_interval times this.")
@click.option("--max-nodes", type=int, help="limits.max_nodes: refuse new nodes beyond it.")
@click.option("--max-body-bytes", type=int, help="limits.max_body_bytes of one push.")
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False),
    help="Write the bound addresses as JSON here once every listener is up.",
)
@print_config_option
@log_level_options
def command(
    config_path: str | None,
    otlp_grpc: str | None,
    otlp_http: str | None,
    api: str | None,
    push_interval: str | None,
    ttl_multiplier: float | None,
    max_nodes: int | None,
    max_body_bytes: int | None,
    ready_file: str | None,
    print_config: bool,
    log_level: str,
    verbose: bool,
) -> None:
    """Receive node health over OTLP, serve per-group thresholds, flag stragglers."""
    # First, before the imports, the configuration and the listeners: a SIGHUP from here on
    # is a reload once Fleet is ready, not the end of the process.
    hangups = StartupHangups("fleet").install()
    from ingero.fleet.config import FleetConfig
    from ingero.fleet.daemon import FleetDaemon, write_ready_file
    from ingero.runtime.config import load_config

    setup_logging(log_level, verbose, "%(levelname)s %(name)s: %(message)s")
    overrides = {
        "listen.otlp_grpc": otlp_grpc,
        "listen.otlp_http": otlp_http,
        "listen.api": api,
        "push_interval": push_interval,
        "ttl_multiplier": ttl_multiplier,
        "limits.max_nodes": max_nodes,
        "limits.max_body_bytes": max_body_bytes,
    }

    def read_config() -> FleetConfig:
        return load_config(FleetConfig, "fleet", config_path, overrides)

    config = read_config()
    if print_config:
        show_config(config)
        return
    # SIGHUP reads the file again for the tokens' scopes (auth.token_clusters)
    daemon = FleetDaemon(config, read_config=read_config)
    drain = None
    if config.drain.enabled:  # opt-in: ingero.slurm.drain carries decisions to Slurm
        from ingero.slurm.drain import attach

        controller = drain = attach(daemon, config.drain)
        daemon.metrics.read_drain_failures(lambda: controller.failures)
        if config.drain.resume_idle.enabled:
            daemon.metrics.slurm_counts.resumes = lambda: dict(controller.idle_outcomes)
    verdicts = None
    if config.verdict.enabled:  # opt-in: each ended job's verdict into its AdminComment
        from ingero.slurm.verdict_writer import attach as attach_verdicts

        writer = verdicts = attach_verdicts(daemon, config.verdict)
        daemon.metrics.slurm_counts.verdicts = lambda: dict(writer.outcomes)
        daemon.metrics.slurm_counts.verdict_failures = lambda: writer.failures
    try:
        try:
            bound = daemon.start()
        except OSError as exc:
            raise UnavailableError(f"fleet: cannot listen: {exc}") from None
        if ready_file:
            try:
                write_ready_file(ready_file, bound)
            except OSError as exc:
                daemon.stop()
                raise UsageError(f"--ready-file {ready_file}: {exc.strerror or exc}") from None
        daemon.run_until_signal(hangups)
    finally:
        if drain is not None:  # let a Slurm call in flight finish before exiting
            drain.stop()
        if verdicts is not None:
            verdicts.stop()
