"""``ingero echo``: run the cluster event store (OTLP in; HTTP+JSON API, MCP and SQL out)."""

from __future__ import annotations

import asyncio
import json
import logging

import click

from ingero.config import load_config, to_dict


@click.command("echo")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="YAML config file")
@click.option("--db", help="SQLite database path (db)")
@click.option("--api", help="HOST:PORT of the HTTP API and MCP (listen.api)")
@click.option("--otlp-grpc", help="HOST:PORT of the OTLP/gRPC receiver (listen.otlp_grpc)")
@click.option("--otlp-http", help="HOST:PORT of the OTLP/HTTP receiver (listen.otlp_http)")
@click.option("--tokens-file", help="bearer tokens file (auth.tokens_file)")
@click.option("--print-config", is_flag=True, help="print the effective configuration and exit")
def echo(
    config_path: str | None,
    db: str | None,
    api: str | None,
    otlp_grpc: str | None,
    otlp_http: str | None,
    tokens_file: str | None,
    print_config: bool,
) -> None:
    """Run Echo, the durable cluster event store."""
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
            "auth.tokens_file": tokens_file,
        },
    )
    if print_config:
        click.echo(json.dumps(to_dict(config), indent=2))
        return
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from ingero.echo.daemon import EchoDaemon

    asyncio.run(EchoDaemon(config).run())
