"""``ingero echo``: run the cluster event store (OTLP in; HTTP+JSON API, MCP and SQL out)."""

from __future__ import annotations

import asyncio

import click

from ingero.cli.options import log_level_options, print_config_option, setup_logging
from ingero.cli.options import print_config as show_config
from ingero.runtime.config import load_config
from ingero.runtime.hangup import StartupHangups


@click.command("echo")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="YAML config file")
@click.option("--db", help="SQLite database path (db)")
@click.option("--api", help="HOST:PORT of the HTTP API and MCP (listen.api)")
@click.option("--otlp-grpc", help="HOST:PORT of the OTLP/gRPC receiver (listen.otlp_grpc)")
@click.option("--otlp-http", help="HOST:PORT of the OTLP/HTTP receiver (listen.otlp_http)")
@click.option(
    "--token-table", "--tokens-file", "token_table", help="bearer token table (auth.token_table)"
)
@print_config_option
@log_level_options
def echo(
    config_path: str | None,
    db: str | None,
    api: str | None,
    otlp_grpc: str | None,
    otlp_http: str | None,
    token_table: str | None,
    print_config: bool,
    log_level: str,
    verbose: bool,
) -> None:
    """Run Echo, the durable cluster event store."""
    # First, before the imports, the configuration, the store and the listeners: a SIGHUP
    # from here on is a reload once Echo is ready, not the end of the process.
    hangups = StartupHangups("echo").install()
    from ingero.echo.config import EchoConfig

    config = load_config(
        EchoConfig,
        "echo",
        config_path,
        {
            "db": db,
            "listen.api": api,
            "listen.otlp_grpc": otlp_grpc,
            "listen.otlp_http": otlp_http,
            "auth.token_table": token_table,
        },
    )
    if print_config:
        show_config(config)
        return
    setup_logging(log_level, verbose, "%(levelname)s %(name)s: %(message)s")
    from ingero.echo.daemon import EchoDaemon

    asyncio.run(EchoDaemon(config).run(hangups))
